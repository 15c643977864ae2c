"""One error type for bad user input: its message is one line saying what is
wrong and how to fix it. ``scripts/train.py`` prints it as ``error: ...``."""


class DAELConfigError(ValueError):
    """Bad configuration, command line or data layout."""
