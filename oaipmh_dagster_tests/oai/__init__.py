"""Tests of the OAI-PMH protocol package."""
