"""torchrun whose workers fork from a launcher that has imported the plugin (the tests' launcher).

``python tests/forked_torchrun.py --run-path --start-method fork [torchrun's flags] script ...``
is torchrun itself (``torch.distributed.run.main``: its rendezvous, its elastic agent, the
environment of each worker, its failure report) with two flags of its own: ``--run-path`` runs the
script with ``runpy`` in the worker, and ``--start-method fork`` forks each worker from this
process, which imported torch, torchvision, the plugin (its Dassl engine too where Dassl is
installed) and scikit-learn's k-means (ClassAMI) before the rendezvous. A worker then spends no
CPU on imports. One DAEL epoch of the tiny set on 2 processes took 8.5 s of CPU this way against
12.5 s with plain torchrun, and ended with the same weights, bit for bit (2-core AMD EPYC VM).

What it cannot see: a worker's own start (its imports, the GC paused around torch's import), and
signals reaching workers in sessions of their own. The tests that signal or kill a job, or read its
process tree, launch plain ``python -m torch.distributed.run``, whose workers are fresh processes.
"""

import sys

import sklearn.cluster  # noqa: F401
import sklearn.metrics  # noqa: F401
from torch.distributed.run import main

import dael_plugin
import dael_plugin.tools.train  # noqa: F401

if dael_plugin.HAS_DASSL:
    import dael_plugin.dassl_adapter.trainer  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
