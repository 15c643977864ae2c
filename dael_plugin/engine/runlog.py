"""log.txt for the built-in engine: everything printed also goes to the file."""

from __future__ import annotations

import io
import os
import sys
import time
from typing import Optional


class _Tee:
    def __init__(self, stream, path: str) -> None:
        self.stream = stream
        self.file = open(path, "a", buffering=1)

    def write(self, msg: str) -> int:
        self.stream.write(msg)
        self.file.write(msg)
        return len(msg)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def isatty(self) -> bool:
        return False


def setup_logger(output_dir: str) -> str:
    """Tee stdout into ``<output_dir>/log.txt``; an existing log is kept, as Dassl does."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "log.txt")
    if os.path.exists(path):
        path += time.strftime("-%Y-%m-%d-%H-%M-%S")
    if isinstance(sys.stdout, _Tee):
        sys.stdout = sys.stdout.stream
    sys.stdout = _Tee(sys.stdout, path)
    return path


def log_only(text: str) -> Optional[str]:
    """Write ``text`` to the run's log file and not to the terminal: the builtin engine's tee or
    Dassl's ``Logger`` (both keep the file as ``.file``). Returns the file's path; without a log
    (ranks other than 0, or no logger yet) it writes nothing and returns None."""
    f = getattr(sys.stdout, "file", None)
    if f is None or getattr(f, "closed", True):
        return None
    sys.stdout.flush()
    f.write(text if text.endswith("\n") else text + "\n")
    f.flush()
    return getattr(f, "name", "log.txt")


def close_logger() -> None:
    """Undo :func:`setup_logger` (for in-process callers such as notebooks and tests)."""
    if isinstance(sys.stdout, _Tee):
        tee = sys.stdout
        sys.stdout = tee.stream
        tee.file.close()
    elif type(sys.stdout).__module__ == "dassl.utils.logger":  # Dassl's setup_logger: console + file
        logger = sys.stdout
        sys.stdout = logger.console
        if logger.file is not None:
            logger.file.close()
        # Its __del__ closes both: leave it a console of its own, not the one just put back.
        logger.file, logger.console = None, io.StringIO()
