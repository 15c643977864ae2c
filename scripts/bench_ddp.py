#!/usr/bin/env python
"""What several processes add to a DAEL step: the collectives and bytes of the gradient (dael_plugin.bench.ddp)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.bench.ddp import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
