"""A command process's start: its imports with Python's cyclic garbage collector paused.

Importing torch and torchvision makes about a million objects that live as long as the process, and
the collector scans them again and again while they are being made: on the 2-core AMD EPYC VM,
``python -c "import torch, torchvision"`` took 5.4 and 6.3 s of CPU (the medians of two sets of five
runs), and 4.5 and 4.3 s with the collector paused and what the imports made frozen (``gc.freeze``). A process
of its own (``python scripts/train.py``, ``python -m dael_plugin.tools.train``: every run a sweep,
torchrun or a test starts, and each of torchrun's workers) pauses the collector before its first
import and resumes it when its command starts. The frozen objects are then never scanned again, which
also makes every later collection of the run cheaper, and a forked loader worker does not copy the
pages a scan would touch. Nothing a run computes changes: the collector only frees unreachable
objects. A command called from Python (a notebook, a test) finds the collector as it was.
"""

from __future__ import annotations

import gc

_paused = False


def pause_for_imports() -> None:
    """Pause the collector until ``resume_after_imports``, where it runs."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_after_imports() -> None:
    """Freeze what the imports made and resume the collector, where ``pause_for_imports`` paused it;
    otherwise nothing (a caller's own objects are never frozen)."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False
