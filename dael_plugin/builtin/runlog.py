"""log.txt for the built-in engine: everything printed also goes to the file."""

from __future__ import annotations

import os
import sys
import time


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


def close_logger() -> None:
    """Undo :func:`setup_logger` (for in-process callers such as notebooks and tests)."""
    if isinstance(sys.stdout, _Tee):
        tee = sys.stdout
        sys.stdout = tee.stream
        tee.file.close()
