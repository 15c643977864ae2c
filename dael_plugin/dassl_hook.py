"""Run a function once a module has finished importing, or now if it already has.

``import dael_plugin`` registers the DAEL trainer, datasets and backbones into Dassl's
registries. Importing ``dassl.engine`` costs about two seconds (it pulls in scikit-learn, SciPy
and pandas), which every built-in engine process, torchrun worker and sweep run would pay for
nothing. So the registration runs when ``dassl.engine`` is imported, by whoever imports it
first: Dassl's own ``tools/train.py`` (before or after its ``import dael_plugin``), the plugin's
Dassl engine, or a user's script. Whatever builds a Dassl trainer has imported ``dassl.engine``
by then, so no Dassl trainer is ever built from a registry without the plugin's entries
(a test checks both import orders and Dassl's own script).

A leaf: the standard library only.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable, List

_lock = threading.Lock()


def initialised(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the other finders, and wraps its loader so that the callbacks run
    right after the module's code has run (the module is complete, its registries filled)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: List[Callable[[], None]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                real = spec.loader.exec_module
                spec.loader = _Wrapped(spec.loader, real, self)
                return spec
            if spec is not None:
                return spec
        return None

    def fire(self) -> None:
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn()


class _Wrapped(importlib.abc.Loader):
    def __init__(self, loader, real_exec, hook: _AfterImport) -> None:
        self.loader, self.real_exec, self.hook = loader, real_exec, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.real_exec(module)
        # the import machinery marks the module initialised after exec_module returns; it is complete now
        self.hook.fire()

    def __getattr__(self, item):  # is_package, get_code, get_source, ...
        return getattr(self.loader, item)


def when_imported(name: str, fn: Callable[[], None]) -> None:
    """Call ``fn()`` now if ``name`` is imported, else right after it is (once)."""
    with _lock:
        if not initialised(name):
            hook = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None)
            if hook is None:
                hook = _AfterImport(name)
                sys.meta_path.insert(0, hook)
            hook.callbacks.append(fn)
            return
    fn()
