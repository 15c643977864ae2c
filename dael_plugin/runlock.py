"""One live run per output directory: a lock file with the owner's pid and host.

A lock whose owner is gone (same host, pid dead, or the pid now belongs to a
process that started later) is stale: it is taken over with one log line.
A lock from another host cannot be checked, so it is refused with the path
to delete if that run is known to be dead.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Optional

from .errors import DAELConfigError

LOCK = ".dael_run.lock"


def _start_time(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _start_time(pid)
    return start is None or now is None or now == start


class RunLock:
    def __init__(self, output_dir: str) -> None:
        self.path = os.path.join(output_dir, LOCK)
        self.held = False

    def acquire(self) -> "RunLock":
        me = {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid()),
              "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._handle_existing()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise DAELConfigError(f"could not take the lock {self.path}; another run keeps creating it")

    def _handle_existing(self) -> None:
        try:
            with open(self.path) as f:
                owner = json.load(f)
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            owner, pid, host = {}, -1, ""
        if pid > 0 and host == socket.gethostname():
            if pid != os.getpid() and _alive(pid, owner.get("start")):
                raise DAELConfigError(
                    f"output directory {os.path.dirname(self.path)} is in use by a live run (pid {pid} on {host}, "
                    f"since {owner.get('since', '?')}); wait for it, or pass another --output-dir"
                )
            print(f"dael_plugin: removing a stale lock of pid {pid} (no longer running)")
        elif pid > 0:
            raise DAELConfigError(
                f"output directory {os.path.dirname(self.path)} is locked by pid {pid} on host {host} "
                f"(since {owner.get('since', '?')}); if that run is dead, delete {self.path}"
            )
        else:
            print(f"dael_plugin: removing an unreadable lock file {self.path}")
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
