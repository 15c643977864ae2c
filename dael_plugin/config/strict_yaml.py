"""Config files read as plain data, with no way to make the reader hang or guess.

``yaml.safe_load`` runs no code, but it expands aliases (a 1 KB file of anchors nested nine deep,
"billion laughs", grows to gigabytes inside yacs's type check and its config dump) and keeps the
last of two equal keys without a word (a second ``OPTIM:`` block silently drops the first). This
reader refuses both, naming the line, and refuses files that are not small regular files.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from dael_plugin.errors import DAELConfigError

MAX_BYTES = 1 << 20  # a config file is a few KB; 1 MiB is far beyond any real one
MAX_DEPTH = 32  # Dassl's configs nest 4 deep; PyYAML's recursive reader fails near 500 with a RecursionError


class _StrictLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 (PyYAML's signature)
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}): config files are read without aliases", event.start_mark
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: ANN001
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice in one mapping (first at line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def load_config_file(path: str) -> Any:
    """The YAML document in ``path``, or one :class:`DAELConfigError` line saying what is wrong."""
    try:
        st = os.stat(path)
    except OSError:
        raise DAELConfigError(f"config file {path!r} not found") from None
    if not stat.S_ISREG(st.st_mode):
        raise DAELConfigError(f"config file {path} is not a regular file (a FIFO, device or folder); pass a YAML file")
    if st.st_size > MAX_BYTES:
        raise DAELConfigError(f"config file {path} is {st.st_size:,} bytes; a config file is YAML of a few KB")
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES + 1).decode("utf-8")
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except (OSError, UnicodeDecodeError) as exc:
        raise DAELConfigError(f"config file {path} cannot be read ({type(exc).__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None)
        detail = (
            f": {problem}" if problem and any(w in problem for w in ("alias", "appears twice", "levels deep")) else ""
        )
        raise DAELConfigError(
            f"config file {path} is not valid YAML{line}{detail}; fix it or pass another file"
        ) from None
