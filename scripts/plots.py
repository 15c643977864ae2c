#!/usr/bin/env python
"""Figures from a sweep's runs (see ``dael_plugin.tools.plots``; also ``dael-plots``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.tools.plots import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
