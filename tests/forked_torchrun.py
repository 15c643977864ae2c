"""torchrun whose workers fork from a launcher that has imported the plugin (the tests' launcher).

``python tests/forked_torchrun.py --run-path --start-method fork [torchrun's flags] script ...``
is torchrun itself (``torch.distributed.run.main``: its rendezvous, its elastic agent, the
environment of each worker, its failure report) with two flags of its own: ``--run-path`` runs the
script with ``runpy`` in the worker, and ``--start-method fork`` forks each worker from this
process, which imported torch, torchvision, the plugin (its Dassl engine too where Dassl is
installed) and scikit-learn's k-means (ClassAMI) before the rendezvous, with the GC paused as
scripts/train.py pauses it. A worker then spends no CPU on imports. One DAEL epoch of the tiny set
on 2 processes (records on) took 6.5 s of CPU this way against 13.2 s with plain torchrun (user +
sys, the mean of two pairs, 2-core AMD EPYC VM), and ended with the same weights, bit for bit.

What it cannot see: a worker's own start (its imports, the GC paused around torch's import), and
signals reaching workers in sessions of their own. The tests that signal or kill a job, or read its
process tree, launch plain ``python -m torch.distributed.run``, whose workers are fresh processes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin import startup  # noqa: E402

startup.pause_for_imports()  # as scripts/train.py imports: the GC paused, what the imports made frozen

import sklearn.cluster  # noqa: E402,F401
import sklearn.metrics  # noqa: E402,F401
from torch.distributed.run import main  # noqa: E402

import dael_plugin  # noqa: E402
import dael_plugin.tools.train  # noqa: E402,F401

if dael_plugin.HAS_DASSL:
    import dael_plugin.dassl_adapter.trainer  # noqa: F401

startup.resume_after_imports()  # before the rendezvous: the workers inherit the frozen objects

if __name__ == "__main__":
    sys.exit(main())
