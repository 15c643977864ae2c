"""Shared fixtures. Set DAEL_PLUGIN_HIDE_DASSL=1 to run the suite as on a machine without Dassl."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if os.environ.get("DAEL_PLUGIN_HIDE_DASSL") == "1":
    sys.modules["dassl"] = None  # makes `import dassl` raise ImportError

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: one thread per worker and per process it starts, so that
    # they do not oversubscribe the cores (a run's own thread count is in its provenance).
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# glibc's malloc hands a freed block of over 128 KB back to the kernel, and the next step maps and
# faults it in again: a sixth of a CPU training run's time in the kernel. Keeping up to 1 GB of freed
# memory takes a 2-epoch DAEL run from 24.5 to 21.6 s of CPU (mean of 3 interleaved pairs, 2-core AMD
# EPYC, 2026-11-29), with the same numbers. For the processes the tests start (the variables) and for
# this one (mallopt; the variables are read when a process starts). docs/speed.md has it for users.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 30, "MALLOC_TOP_PAD_": 64 << 20}
for _key, _value in MALLOC.items():
    os.environ.setdefault(_key, str(_value))
if sys.platform.startswith("linux"):
    import ctypes

    _mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's; absent from musl
    if _mallopt is not None:
        for _param, _key in ((-3, "MALLOC_MMAP_THRESHOLD_"), (-1, "MALLOC_TRIM_THRESHOLD_"), (-2, "MALLOC_TOP_PAD_")):
            _mallopt(_param, int(os.environ[_key]))

import dassl_layouts  # noqa: E402

import dael_plugin  # noqa: E402
from dael_plugin.data.folders import DATASETS  # noqa: E402

SKIP_REASON = "Dassl.pytorch is not installed (install it by hand, see README); Dassl tests skipped"


# The tests that take 8 s or more on 2 cores (processes, torchrun, kill -9, sweeps, training to
# an accuracy): marked ``slow`` and left out by ``make test-fast``. The accuracy test, the longest,
# starts first under xdist so that it does not finish alone at the end of the run (starting every
# slow test first was a minute slower: they contend for the 2 cores).
SLOW = (
    "test_accuracy.py",
    "test_distributed.py",
    "kill_9",
    "submitit",
    "test_bench_script",
    "sweep",
    "wheel",
    "torchrun",
    "through_the_same_script",
    "resume_after",
    "racing_for_the_lock",
    "full_disk",
    "worker_count",
    "three_steps_match_dassls",
    "eval_only_reloads",
    "refuses_pickled_code_and_config",
    "replaces_unreadable_images_and_check_data",
    "host_values_never_go",
    "top3_and_tsne",
    "stopped_and_resumed_ends_bit_for_bit",
    "own_train_script_runs",
    "through_train_script",
    "ctrl_c_exits",
    "sigterm_stops_a_run",
    "relaunch_with_other_settings",
    "timm_backbone_under_dassl",
    "views_on_the_device_and_a_log",
    "dassls_own_dael_step_by_step",
    "saw_the_target_or_other_images",
    "loads_a_built_in_source_model",
    "seed_minus_one",
    "backbone_weights_on_the_dassl_engine",
    "another_trainer_into_a_finished",
    "offline_with",
    "every_shipped_configs_backbone",
)


def _slow(item) -> bool:
    return "accuracy" in item.keywords or any(s in item.nodeid for s in SLOW)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: 0 if "accuracy" in item.keywords else 1)  # the longest first; stable
    if dael_plugin.HAS_DASSL:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "dassl" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """Name a failing test the moment it fails (on the controller under xdist), so that a run cut
    short by a time limit still says which tests failed; the summary at the end says it again."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller says it, once
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when})\n")
        sys.stderr.flush()


def _shared_dir(tmp_path_factory, name):
    """A folder all of this session's xdist workers share (their base folders' parent is the
    session's), so that a fixture made once serves both workers; a worker's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    return str((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """The embedded set, generated once per session: ``ensure_embedded`` lets one worker generate it
    under the kernel's lock while the other waits, as the runs of a sweep share a fresh --root."""
    from dael_plugin.data.embedded import ensure_embedded

    root = _shared_dir(tmp_path_factory, "data")
    ensure_embedded(root)
    return root


@pytest.fixture(scope="session")
def tiny_root(data_root, tmp_path_factory):
    """The embedded set cut to 6 images per class, domain and split, for the
    end-to-end CLI tests: they check plumbing, not accuracy, in a few seconds.
    Made once per session, into a temporary folder renamed into place when whole."""
    import shutil
    import tempfile

    import filelock

    from dael_plugin.data.embedded import DATASET_DIR

    root = _shared_dir(tmp_path_factory, "tiny")
    with filelock.FileLock(root + ".lock"):
        if os.path.isdir(root):
            return root
        src = os.path.join(data_root, DATASET_DIR)
        tmp = tempfile.mkdtemp(prefix="tiny-", dir=os.path.dirname(root))
        dst = os.path.join(tmp, DATASET_DIR)
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            out = os.path.join(dst, os.path.relpath(dirpath, src))
            os.makedirs(out, exist_ok=True)
            images = sorted(f for f in filenames if f.endswith(".png"))[:6]
            others = [f for f in filenames if not f.endswith(".png")]  # the VERSION stamp
            for f in images + others:
                shutil.copy(os.path.join(dirpath, f), os.path.join(out, f))
        os.rename(tmp, root)
    return root


# -- Dassl's dataset formats (tests/dassl_layouts.py), shared by test_dassl_formats and test_fingerprint
@pytest.fixture(scope="session")
def layouts_root(tmp_path_factory):
    """Every format but Digit-5, under one --root."""
    root = str(tmp_path_factory.mktemp("layouts"))
    dassl_layouts.domainnet(root)
    dassl_layouts.office(root, "office31", DATASETS["Office31"].domains)
    dassl_layouts.office(root, "office_home", DATASETS["OfficeHome"].domains)
    dassl_layouts.pacs(root)
    dassl_layouts.vlcs(root)
    dassl_layouts.visda17(root)
    dassl_layouts.cifar_stl(root)
    dassl_layouts.cifar_c(root, "cifar10")
    dassl_layouts.cifar_c(root, "cifar100")
    dassl_layouts.wilds(root)
    dassl_layouts.ssl(root)
    return root


@pytest.fixture(scope="session")
def digit5_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("digit5"))
    dassl_layouts.digit5(root)
    return root


@pytest.fixture(scope="session")
def shipped_root(layouts_root, digit5_root, tmp_path_factory):
    """One --root with every shipped dataset: links to the two fixtures, plus the DG folder sets."""
    root = str(tmp_path_factory.mktemp("shipped"))
    for src in (layouts_root, digit5_root):
        for name in os.listdir(src):
            os.symlink(os.path.join(src, name), os.path.join(root, name))
    dassl_layouts.digits_dg(root, "digits_dg", ("mnist", "mnist_m", "svhn", "syn"))
    dassl_layouts.digits_dg(root, "office_home_dg", ("art", "clipart", "product", "real_world"))
    return root


def run_here(args):
    """``run_train``'s result for a run made in this process: ``main`` is what scripts/train.py
    calls, and a process start costs about 4 s of CPU (imports). The script's own process, its
    stderr contract and the runs without Dassl keep subprocess tests of their own."""
    import contextlib
    import io
    import subprocess

    from dael_plugin.tools.train import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def run_train(args, env_hide_dassl=False, timeout=600):
    """Run scripts/train.py in a subprocess; returns CompletedProcess."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if env_hide_dassl:
        env["DAEL_PLUGIN_HIDE_DASSL"] = "1"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py")] + list(args)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# A small backbone with Dassl's digit-5 structure (conv-BN blocks, then FC-BN-ReLU-dropout), for
# the tests that compare a trainer's steps with Dassl's own: batch norm and dropout draws in the
# order of the calls, as in cnn_digit5_m3sda, at 1% of its 31.8M parameters, whose 8192 x 3072 FC
# made each of those tests 10-40 s of CPU. That the rebuilt cnn_digit5_m3sda equals Dassl's, key for
# key and output for output, is test_dassl_formats.py's own test.
DROPOUT_CNN = "dael_test_dropout_cnn"


def _dropout_cnn_class():
    """Made on first use: the pytest process itself imports no torch."""
    import torch
    from torch import nn
    from torch.nn import functional as f

    class DropoutCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
            self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
            self.fc1, self.bn3 = nn.Linear(32 * 8 * 8, 128), nn.BatchNorm1d(128)
            self.fc2, self.bn4 = nn.Linear(128, 64), nn.BatchNorm1d(64)
            self.out_features = 64

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = f.max_pool2d(f.relu(self.bn1(self.conv1(x))), 2)
            x = f.max_pool2d(f.relu(self.bn2(self.conv2(x))), 2)
            x = f.dropout(f.relu(self.bn3(self.fc1(x.flatten(1)))), training=self.training)
            return f.relu(self.bn4(self.fc2(x)))

    return DropoutCNN


@pytest.fixture
def dropout_cnn(monkeypatch):
    """``DROPOUT_CNN`` in the built-in engine's backbones and, where Dassl is installed, in Dassl's
    ``BACKBONE_REGISTRY`` (registered once; the name is the tests' own)."""
    from dael_plugin import backbones

    cls = _dropout_cnn_class()
    monkeypatch.setitem(backbones.OWN_BACKBONES, DROPOUT_CNN, cls)
    try:
        from dassl.modeling.backbone import BACKBONE_REGISTRY
    except ImportError:
        return DROPOUT_CNN
    if DROPOUT_CNN not in BACKBONE_REGISTRY.registered_names():

        def factory(pretrained=False, **kwargs):
            return cls()

        factory.__name__ = DROPOUT_CNN
        BACKBONE_REGISTRY.register(factory)
    return DROPOUT_CNN
