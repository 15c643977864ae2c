#!/usr/bin/env python
"""Tables from a sweep's results.json records (see ``dael_plugin.tools.collect``; also ``dael-collect``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.tools.collect import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
