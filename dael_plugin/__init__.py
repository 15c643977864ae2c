"""dael-plugin: Domain Adaptive Ensemble Learning for Dassl.pytorch.

``import dael_plugin`` registers the DAEL trainer (as ``DAEL`` and
``DAELDG``), the plugin's datasets and backbones into Dassl's registries
when Dassl is importable. Without Dassl, the algorithm core and the built-in
engine still work.
"""
from __future__ import annotations

import os
import sys

if os.environ.get("DAEL_PLUGIN_HIDE_DASSL") == "1":
    # Behave exactly as on a machine without Dassl (used by the tests and CI).
    sys.modules.setdefault("dassl", None)

from .config import add_dael_config
from .errors import DAELConfigError

__version__ = "0.3.0"

try:
    import dassl  # noqa: F401

    HAS_DASSL = True
except ImportError:
    HAS_DASSL = False

if HAS_DASSL:
    from .dassl_adapter import register as _register

    _register()

__all__ = ["DAELConfigError", "HAS_DASSL", "add_dael_config", "__version__"]
