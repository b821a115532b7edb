"""Tests of the demo OAI-PMH server."""
