#!/usr/bin/env python
"""Time and count DAEL training: this plugin against Dassl's own DAEL, side by side, in one run. (dael_plugin.bench.speed)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.bench.speed import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
