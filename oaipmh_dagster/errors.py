"""The root of every exception the package raises."""


class OAIPMHDagsterError(Exception):
    """Root of every exception this package raises."""
