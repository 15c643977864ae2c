#!/usr/bin/env python
"""Sweeps of scripts/train.py runs (see ``dael_plugin.tools.sweep``; also ``dael-sweep``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.tools.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
