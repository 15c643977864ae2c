"""dael-plugin: Domain Adaptive Ensemble Learning for Dassl.pytorch.

``import dael_plugin`` registers the DAEL trainer (as ``DAEL`` and ``DAELDG``), the
plugin's datasets and backbones into Dassl's registries when Dassl is importable.
Without Dassl, the algorithm core and the built-in engine still work.

The rooms, from the bottom up (imports run downwards only):

- ``core/``: the method in plain PyTorch (heads, losses, pseudo-labels, per-chunk batch norm);
- ``config/``, ``data/``, ``transforms/``, ``backbones/``: the keys the plugin adds and their
  checks; folders, images, the embedded set, samplers and domain batching; the weak and strong
  views on the host and on the device; timm and the plugin's own backbones;
- ``engine/``: what both engines share (the step, execution options, divergence guard,
  checkpoints, run lock, run records, the one atomic writer);
- ``builtin/`` and ``dassl_adapter/``: the two engines;
- ``tools/``: the commands (train, sweep, collect, plots, demo).
"""

from __future__ import annotations

from dael_plugin.about import HAS_DASSL, __version__
from dael_plugin.config import add_dael_config
from dael_plugin.errors import DAELConfigError

if HAS_DASSL:
    from dael_plugin.dassl_adapter import register as _register

    _register()

__all__ = ["DAELConfigError", "HAS_DASSL", "add_dael_config", "__version__"]
