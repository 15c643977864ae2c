"""What this installation is: the plugin's version, and whether Dassl is importable.

A leaf: it imports nothing of the plugin, so every room may read it.
``DAEL_PLUGIN_HIDE_DASSL=1`` makes this process behave as on a machine without Dassl
(used by the tests and CI).
"""

from __future__ import annotations

import os
import sys

__version__ = "0.4.0"  # 0.4: modules laid out by role (dael_plugin.engine, .tools, .config, .transforms)

if os.environ.get("DAEL_PLUGIN_HIDE_DASSL") == "1":
    sys.modules.setdefault("dassl", None)  # makes `import dassl` raise ImportError

try:
    import dassl  # noqa: F401

    HAS_DASSL = True
except ImportError:
    HAS_DASSL = False

# The engines a run may ask for (``--engine`` of train, sweep and demo): auto picks Dassl where importable.
ENGINES = ("auto", "dassl", "builtin")
