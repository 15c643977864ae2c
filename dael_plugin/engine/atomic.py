"""The one way this project writes a file: atomically, surviving a full disk.

Every write (checkpoints, ``results.json``, ``failed.json``, the run lock's
owner record, sweep files, tables and figures) goes through
:func:`write_bytes`: the data goes to a temporary file in the same folder
(``<name>.tmp.<pid>``), is fsynced, and is renamed over the target, so a
reader sees the old file or the new one, never half of one. When the write
fails (``ENOSPC`` or any other ``OSError``) the temporary file is removed and
:class:`WriteError` says, in one line, which path, how many bytes it needed
and how many were free; the previous file is left whole.

A writer killed mid-write (``kill -9``) leaves its temporary file behind;
:func:`remove_stale_temps` deletes those of processes that are gone, at the
start of the next run in the folder.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import stat
from typing import Any, List, Optional

from dael_plugin.errors import DAELConfigError

_TMP = re.compile(r"\.tmp\.(\d+)$")


class WriteError(DAELConfigError):
    """A file could not be written; the message names it (exit code 2)."""


def _free_bytes(folder: str) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return -1


def write_bytes(path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        free = _free_bytes(folder)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise WriteError(
                f"cannot write {path}: no space left on the device (it needs {len(data):,} bytes, "
                f"{max(free, 0):,} are free); free some space and rerun to resume"
            ) from None
        raise WriteError(
            f"cannot write {path} ({exc.strerror or exc}); the previous file, if any, is unchanged"
        ) from None
    except BaseException:  # Ctrl-C or SIGTERM mid-write: no half file, no leftover
        _remove(tmp)
        raise
    return path


def link_or_copy(source: str, path: str) -> str:
    """``path`` atomically made the same file as ``source``: a hard link (no bytes written), or a
    copy where the file system has none. A later atomic write of either path replaces that path
    alone."""
    tmp = f"{path}.tmp.{os.getpid()}"
    _remove(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        with open(source, "rb") as f:
            return write_bytes(path, f.read())
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def write_text(path: str, text: str) -> str:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any) -> str:
    return write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json_dict(path: str, limit: int = 1 << 20) -> Optional[dict]:
    """The JSON object :func:`write_json` wrote to ``path``; None when there is no such file.
    Anything else raises ``ValueError`` saying what it is: not a regular file (a FIFO would block
    ``open`` until a writer comes), over ``limit`` bytes, unreadable, not JSON, not an object."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot be read ({type(exc).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("is not a regular file")
    if st.st_size > limit:
        raise ValueError(f"is {st.st_size:,} bytes, not a settings file")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(limit + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read ({type(exc).__name__})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"is truncated or not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise ValueError(f"holds a JSON {type(data).__name__}, not an object")
    return data


def save_torch(path: str, obj: Any) -> str:
    """``torch.save`` through :func:`write_bytes` (serialised in memory first, so the bytes a
    full disk lacks can be named)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_bytes(path, buf.getvalue())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(folder: str, recursive: bool = False) -> List[str]:
    """Delete ``*.tmp.<pid>`` files in ``folder`` whose writer is no longer running."""
    removed: List[str] = []
    if not os.path.isdir(folder):
        return removed
    walker = os.walk(folder) if recursive else [(folder, [], os.listdir(folder))]
    for dirpath, _, files in walker:
        for name in files:
            m = _TMP.search(name)
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                path = os.path.join(dirpath, name)
                _remove(path)
                removed.append(path)
    return removed


__all__ = [
    "WriteError",
    "read_json_dict",
    "remove_stale_temps",
    "save_torch",
    "write_bytes",
    "write_json",
    "write_text",
]
