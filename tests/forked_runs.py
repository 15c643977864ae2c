"""Training runs side by side, each a process forked from this one after its imports (the
accuracy test's launcher).

``python tests/forked_runs.py RUNS.json``, where RUNS.json holds ``[[log, arg, ...], ...]``: each
run is scripts/train.py's ``main`` with those arguments, in a child process of its own whose
stdout and stderr go to ``log``, forked once this process has imported the plugin with the GC
paused (as scripts/train.py imports). It prints each run's exit status and exits 1 if one failed.
The runs compute what separate ``python scripts/train.py`` processes compute, bit for bit
(tests/test_accuracy.py), for one process's imports instead of one per run (about 4 s of CPU each).
"""

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin import startup  # noqa: E402

startup.pause_for_imports()

from dael_plugin.tools.train import main  # noqa: E402

startup.resume_after_imports()


def _child(log: str, argv: list) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def run(runs: list) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for log, *argv in runs:
        pid = os.fork()
        if pid == 0:
            _child(log, argv)
        children.append((pid, log))
    failed = False
    for pid, log in children:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(f"{log}: exit {code}")
        failed |= code != 0
    return int(failed)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.exit(run(json.load(f)))
