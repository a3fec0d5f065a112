"""The one exception type user-facing code raises for bad input; the CLI prints it as a single line and exits 2."""


class TidalError(ValueError):
    """Bad input or an impossible configuration. The message is one line and says what to change."""
