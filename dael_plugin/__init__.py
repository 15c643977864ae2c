"""dael-plugin: Domain Adaptive Ensemble Learning for Dassl.pytorch.

``import dael_plugin`` registers the DAEL trainer (as ``DAEL`` and ``DAELDG``), the
plugin's datasets and backbones into Dassl's registries when Dassl is importable: at once if
``dassl.engine`` is imported, else the moment it is (``dassl_hook``: a built-in engine process
never pays for Dassl's imports). Without Dassl, the algorithm core and the built-in engine
still work.

The rooms, from the bottom up (imports run downwards only):

- ``core/``: the method in plain PyTorch (heads, losses, pseudo-labels, per-chunk batch norm);
- ``config/``, ``data/``, ``transforms/``, ``backbones/``: the keys the plugin adds and their
  checks; folders, images, the embedded set, samplers and domain batching; the weak and strong
  views on the host and on the device; timm and the plugin's own backbones;
- ``engine/``: what both engines share (the step, execution options, the hooks around the epochs,
  divergence guard, checkpoints, run lock, run records, the one atomic writer) and the built-in
  engine's trainer (``engine/trainer.py``);
- ``methods/`` and ``dassl_adapter/``: the methods, one file each, on the built-in engine; the
  plugin's trainer on Dassl's loop and registration into Dassl;
- ``tools/``: the commands (train, sweep, collect, plots, demo).
"""

from __future__ import annotations

import sys

from dael_plugin.about import HAS_DASSL, __version__
from dael_plugin.errors import DAELConfigError


def __getattr__(name: str):
    """``add_dael_config`` on first use (PEP 562): the config table imports torch and
    torchvision (2 s of CPU), which the commands that only plan, lock, launch or collect runs
    (sweep, collect, a submitit job's own process) never need."""
    if name == "add_dael_config":
        from dael_plugin.config import add_dael_config

        return add_dael_config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_with_dassl() -> None:
    from dael_plugin.dassl_hook import initialised

    if "dael_plugin.dassl_adapter" in sys.modules and not initialised("dael_plugin.dassl_adapter"):
        return  # dassl.engine was imported by the adapter's own first line: the adapter registers at its end
    from dael_plugin.dassl_adapter import register_into_dassl

    register_into_dassl()


def _register_with_dassl_part() -> None:
    """``dassl.modeling`` or ``dassl.data`` imported without ``dassl.engine`` (a script that calls
    Dassl's ``build_backbone`` or ``build_dataset`` itself): register now. Inside ``dassl.engine``'s
    own import, which imports both, its hook registers once it is complete."""
    from dael_plugin.dassl_hook import initialised

    if "dassl.engine" in sys.modules and not initialised("dassl.engine"):
        return
    _register_with_dassl()


if HAS_DASSL:
    from dael_plugin.dassl_hook import when_imported

    when_imported("dassl.engine", _register_with_dassl)
    when_imported("dassl.modeling", _register_with_dassl_part)
    when_imported("dassl.data", _register_with_dassl_part)

__all__ = ["DAELConfigError", "HAS_DASSL", "add_dael_config", "__version__"]
