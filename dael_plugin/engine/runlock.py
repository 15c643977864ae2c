"""One live run per output directory: a kernel lock, released by the kernel when its owner dies.

The lock is ``filelock``'s (``fcntl.flock`` on ``.dael_run.lock``): two
processes can never hold it together, and a run killed by any signal, even
``kill -9``, releases it with its last file descriptor; nothing is ever
"stale". Beside it, ``.dael_run.json`` names the owner (pid, host, start
time) for the message a second run gets. On a shared file system where
``flock`` does not reach across hosts (some NFS setups), run one process per
output directory yourself.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import time
from typing import Optional

import filelock

from dael_plugin.engine.atomic import write_json
from dael_plugin.errors import DAELConfigError

LOCK = ".dael_run.lock"
OWNER = ".dael_run.json"


class BusyError(DAELConfigError):
    """The output directory is held by another live run (exit code 75: try again later)."""


class ClashError(BusyError):
    """The output directory is held by a live run of *other* settings: waiting will not help, this
    command needs another folder (exit code 78, sysexits' EX_CONFIG)."""


def _kernel_lock(path: str) -> filelock.BaseFileLock:
    """``flock`` itself: never filelock's soft fallback (a marker file no kernel releases)."""
    kwargs = {"timeout": 0}
    if "fallback_to_soft" in inspect.signature(filelock.UnixFileLock.__init__).parameters:
        kwargs["fallback_to_soft"] = False
    return filelock.UnixFileLock(path, **kwargs)


class RunLock:
    def __init__(self, output_dir: str, settings: Optional[str] = None) -> None:
        """``settings``: a digest of the run's config, kept in the owner file so that a second run
        is told whether the live one is the same run (wait) or another one (another folder)."""
        self.dir = output_dir
        self.settings = settings
        self.path = os.path.join(output_dir, LOCK)
        self.owner_path = os.path.join(output_dir, OWNER)
        self._lock: Optional[filelock.BaseFileLock] = None

    @property
    def held(self) -> bool:
        return self._lock is not None and self._lock.is_locked

    def acquire(self) -> "RunLock":
        for path in (self.path, self.owner_path):
            if os.path.isdir(path):
                raise DAELConfigError(f"{path} is a directory, where the run's lock belongs; remove it and rerun")
        lock = _kernel_lock(self.path)
        try:
            lock.acquire()
        except filelock.Timeout:
            owner = self._owner()
            theirs = owner.get("settings")
            if self.settings and theirs and theirs != self.settings:
                raise ClashError(self._clash_message(owner)) from None
            raise BusyError(self._busy_message()) from None
        except OSError as exc:
            raise DAELConfigError(
                f"cannot take the lock {self.path} ({exc.strerror or exc}); pass a writable --output-dir"
            ) from None
        self._lock = lock
        previous = self._owner()
        if previous and previous.get("pid") != os.getpid():
            print(
                f"dael_plugin: removing a stale lock of pid {previous.get('pid')} on {previous.get('host')} "
                "(that run ended without releasing it; the kernel did)"
            )
        write_json(
            self.owner_path,
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "settings": self.settings,
            },
        )
        return self

    def _owner(self) -> dict:
        try:
            with open(self.owner_path) as f:
                owner = json.load(f)
            return owner if isinstance(owner, dict) else {}
        except (OSError, ValueError):
            return {}

    def _busy_message(self) -> str:
        owner = self._owner()
        who = (
            f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('since', '?')}"
            if owner
            else "another process"
        )
        return (
            f"output directory {self.dir} is in use by a live run ({who}); wait for it to finish, "
            "or pass another --output-dir"
        )

    def _clash_message(self, owner: dict) -> str:
        return (
            f"output directory {self.dir} is in use by a live run with other settings (pid {owner.get('pid')} "
            f"on {owner.get('host')}, since {owner.get('since', '?')}); waiting will not help: pass another "
            "--output-dir for these settings"
        )

    def release(self) -> None:
        if self._lock is not None:
            try:
                os.remove(self.owner_path)
            except OSError:
                pass
            self._lock.release()
            self._lock = None
