#!/usr/bin/env python
"""DAEL against SourceOnly on the embedded set (see ``dael_plugin.tools.demo``; also ``dael-demo``).

python scripts/demo.py [--target blend] [--seeds 1] [--epochs 15] [--root data]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.tools.demo import main  # noqa: E402

if __name__ == "__main__":
    main()
