"""Methods from outside the package: ``--plugin MODULE`` on train and sweep, and the
``dael_plugin.methods`` entry-point group.

A plugin is a module that registers trainers when it is imported (``dael_plugin.methods.register`` for
the built-in engine, Dassl's ``TRAINER_REGISTRY`` for the Dassl engine). ``--plugin`` takes a
module's dotted name (importable from ``sys.path``) or the path of a ``.py`` file. An installed
package lists its modules under the entry-point group instead, as pytest's plugins do::

    [options.entry_points]
    dael_plugin.methods =
        entmin = my_package.entmin

Every entry point of the group is imported by every run and sweep; ``--plugin`` adds more.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from importlib.metadata import entry_points
from typing import List, Sequence

from dael_plugin.errors import DAELConfigError

ENTRY_POINTS = "dael_plugin.methods"


def is_file(name: str) -> bool:
    """A path (``.py`` or with a separator), not a dotted module name."""
    return name.endswith(".py") or os.sep in name or (os.altsep is not None and os.altsep in name)


def _failed(what: str, exc: BaseException) -> DAELConfigError:
    """One line: the exception and the line of the plugin's own code that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return DAELConfigError(f"{what}: importing it failed{where}: {type(exc).__name__}: {first}")


def import_plugin(name: str) -> str:
    """Import one plugin; returns the module's name. A file is imported under its stem's name."""
    if is_file(name):
        path = os.path.abspath(os.path.expanduser(name))
        if not os.path.isfile(path):
            raise DAELConfigError(f"--plugin {name}: no such file; give a .py file or an importable module's name")
        module = os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(module)
        if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
            return module  # imported already (train's main() called twice in one process)
        if loaded is not None:
            raise DAELConfigError(
                f"--plugin {name}: a module named {module!r} is imported already ({getattr(loaded, '__file__', '')}); "
                "rename the file"
            )
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        try:
            spec.loader.exec_module(mod)
        except DAELConfigError:
            sys.modules.pop(module, None)
            raise
        except Exception as exc:  # the user's code: its error in one line, naming its own line
            sys.modules.pop(module, None)
            raise _failed(f"--plugin {name}", exc) from None
        return module
    try:
        importlib.import_module(name)
    except DAELConfigError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise DAELConfigError(
                f"--plugin {name}: no module {exc.name!r} on sys.path; give the path of its .py file, "
                "or install the package that holds it"
            ) from None
        raise _failed(f"--plugin {name}", exc) from None
    except Exception as exc:
        raise _failed(f"--plugin {name}", exc) from None
    return name


def load_plugins(names: Sequence[str] = ()) -> List[str]:
    """The entry-point group's modules, then ``names`` (``--plugin``), each imported once."""
    done = []
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            ep.load()
        except DAELConfigError:
            raise
        except Exception as exc:
            raise _failed(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINTS})", exc) from None
        done.append(ep.value)
    for name in names or ():
        done.append(import_plugin(name))
    return done


def absolute(names: Sequence[str]) -> List[str]:
    """``--plugin`` values for a run started elsewhere (a sweep's runs): files as absolute paths."""
    return [os.path.abspath(os.path.expanduser(n)) if is_file(n) else n for n in names or ()]
