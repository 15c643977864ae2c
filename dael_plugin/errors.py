"""Error types with one-line messages. ``scripts/train.py`` prints them as ``error: ...``.

- :class:`DAELConfigError`: bad configuration, command line, data layout or
  checkpoint (exit code 2).
- :class:`NonFiniteLossError`: training diverged (exit code 3); the last good
  checkpoint is kept and no ``results.json`` is written.
"""

import sys


def say(line: str) -> None:
    """One line on stderr in ONE write: under torchrun every rank shares the terminal (or pipe),
    and with ``PYTHONUNBUFFERED`` set (as in many containers) ``print`` writes the text and its
    newline apart, so two ranks' lines would interleave mid-line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class DAELConfigError(ValueError):
    """Bad configuration, command line or data layout. Raised in a data-loader worker, it reaches the
    main process as torch's copy, whose message is the worker's whole traceback: the copy keeps the
    one line the worker raised."""

    def __init__(self, *args) -> None:
        marker = f".{type(self).__name__}: "
        if args and isinstance(args[0], str) and args[0].startswith("Caught ") and marker in args[0]:
            args = (args[0].rsplit(marker, 1)[1].strip(),) + args[1:]  # (torch's ExceptionWrapper.reraise)
        super().__init__(*args)


class NonFiniteLossError(RuntimeError):
    """A loss or a weight became NaN or inf during training."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as Ctrl-C stops it (exit code 143)."""


# Exit codes that train.py returns and the sweep reads (sysexits' names where one fits).
EXIT_BUSY = 75  # the output directory is held by another live run of the same settings (EX_TEMPFAIL)
EXIT_CLASH = 78  # ... by a live run of other settings: waiting will not help (EX_CONFIG)
