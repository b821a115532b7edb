"""Browser tests: headless Chromium (Debian's) against a real `oaipmh-dagster demo`."""
