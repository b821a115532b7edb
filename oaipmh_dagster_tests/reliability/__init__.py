"""Reliability: fault injection, crash and resume, security, load through the run queue."""
