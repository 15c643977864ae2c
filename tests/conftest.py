"""Shared fixtures. Set DAEL_PLUGIN_HIDE_DASSL=1 to run the suite as on a machine without Dassl."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if os.environ.get("DAEL_PLUGIN_HIDE_DASSL") == "1":
    sys.modules["dassl"] = None  # makes `import dassl` raise ImportError

import dael_plugin  # noqa: E402

SKIP_REASON = "Dassl.pytorch is not installed (install it by hand, see README); Dassl tests skipped"


def pytest_collection_modifyitems(config, items):
    if dael_plugin.HAS_DASSL:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "dassl" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """The embedded set, generated once per session."""
    from dael_plugin.data.embedded import ensure_embedded

    root = str(tmp_path_factory.mktemp("data"))
    ensure_embedded(root)
    return root


def run_train(args, env_hide_dassl=False, timeout=600):
    """Run scripts/train.py in a subprocess; returns CompletedProcess."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if env_hide_dassl:
        env["DAEL_PLUGIN_HIDE_DASSL"] = "1"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py")] + list(args)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
