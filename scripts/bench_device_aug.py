#!/usr/bin/env python
"""Why AUG_ON_DEVICE is plain PyTorch: the candidates timed on one batch. (dael_plugin.bench.device_aug)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.bench.device_aug import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
