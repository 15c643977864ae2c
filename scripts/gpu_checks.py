#!/usr/bin/env python
"""The GPU paths no CPU run takes, run for real: one line per check, PASS or FAIL, and a JSON summary. (dael_plugin.bench.gpu_checks)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.bench.gpu_checks import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
