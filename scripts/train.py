#!/usr/bin/env python
"""Train DAEL or any Dassl trainer: Dassl's ``tools/train.py`` CLI plus ``--engine``.

    python scripts/train.py --trainer DAEL \
        --dataset-config-file configs/datasets/da/embedded_digits.yaml \
        --config-file configs/trainers/da/dael/embedded_digits.yaml \
        --source-domains hand blend font --target-domains street --output-dir output/dael
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":  # a process of its own: torch's imports with the GC paused (startup.py)
    from dael_plugin import startup

    startup.pause_for_imports()  # resumed when main starts

import dael_plugin  # noqa: E402,F401  (registers DAEL into Dassl when Dassl is installed)
from dael_plugin.tools.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
