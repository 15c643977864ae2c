#!/usr/bin/env python
"""DAEL under category shift on the embedded set (see ``dael_plugin.tools.category_shift``).

python scripts/category_shift.py [--root data] [--seeds 1 2 3] [--engine builtin] [--epochs 15]
    python scripts/category_shift.py --split 1 2 --rules --records 3 --seeds 1 2 3 4 5   # the rules' table
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.tools.category_shift import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
