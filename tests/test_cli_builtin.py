"""scripts/train.py on the built-in engine (run as on a machine without Dassl), and bad input."""

import glob
import hashlib
import json
import os
import re
import sys
import types

import numpy
import pytest
import torch
import torchvision
import yaml

import dael_plugin
from conftest import ROOT, run_here, run_train

DS_DA = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
DS_DG = os.path.join(ROOT, "configs/datasets/dg/embedded_digits_dg.yaml")
DAEL_CFG = os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")
SRC_CFG = os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml")
CDAC_CFG = os.path.join(ROOT, "configs/trainers/da/cdac/embedded_digits.yaml")
FAST = [
    # no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
    "SELECTION.EVAL_FREQ",
    "0",
    "OPTIM.MAX_EPOCH",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
    "USE_CUDA",
    "False",
    "DATALOADER.TRAIN_X.BATCH_SIZE",
    "24",
    "DATALOADER.TRAIN_U.BATCH_SIZE",
    "8",
]


def base_args(tiny_root, out, trainer="DAEL", ds=DS_DA, cfg=DAEL_CFG, src=("hand", "blend", "font"), tgt=("street",)):
    return [
        "--trainer",
        trainer,
        "--root",
        tiny_root,
        "--dataset-config-file",
        ds,
        "--config-file",
        cfg,
        "--source-domains",
        *src,
        "--target-domains",
        *tgt,
        "--output-dir",
        str(out),
        "--seed",
        "2",
    ]


def test_auto_engine_without_dassl_runs_dael_da_and_writes_results(tmp_path, tiny_root):
    out = tmp_path / "da"
    per_class = ["TEST.PER_CLASS_RESULT", "True", "TEST.COMPUTE_CMAT", "True"]  # Dassl's evaluator's keys
    proc = run_train(base_args(tiny_root, out) + FAST + per_class, env_hide_dassl=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine = builtin (Dassl is not installed)" in proc.stdout
    # Dassl's epoch under Dassl's name: 60 images a domain, 8 a chunk: 7 batches (the plugin's
    # CyclingDomainSampler would give 8)
    assert "Sampler: RandomDomainSampler: 7 batches per epoch (Dassl's RandomDomainSampler epoch" in proc.stdout
    assert "* accuracy:" in proc.stdout and "* expert accuracy: hand" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    for key in (
        "trainer",
        "dataset",
        "source_domains",
        "target_domains",
        "seed",
        "accuracy",
        "expert_accuracy",
        "epochs",
        "wall_seconds",
    ):
        assert key in res
    assert res["engine"] == "builtin" and res["seed"] == 2 and set(res["expert_accuracy"]) == {"hand", "blend", "font"}
    assert (out / "log.txt").exists() and glob.glob(str(out / "tensorboard" / "events.*"))
    assert (out / "checkpoint.pth.tar").exists() and (out / "model.pth.tar-1").exists()
    assert "loss_u" in (out / "log.txt").read_text()
    # Provenance: the merged config and its hash, the code and library versions, the device.
    prov = res["provenance"]
    assert hashlib.sha256(prov["config"].encode()).hexdigest() == prov["config_sha256"]
    merged = yaml.safe_load(prov["config"])
    assert merged["SEED"] == 2 and merged["DATASET"]["TARGET_DOMAINS"] == ["street"]
    assert merged["TRAINER"]["DAEL"]["FUSE_CHUNKS"] is True
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["dassl"] is None  # hidden here
    import timm  # here: the other tests of this module need no timm

    assert prov["versions"]["timm"] == timm.__version__ and prov["versions"]["torchvision"] == torchvision.__version__
    assert prov["code_version"].startswith(dael_plugin.__version__)
    assert prov["device"].startswith("cpu" if not torch.cuda.is_available() else "cuda")
    # Diagnostics: per-class accuracy of the ensemble and each expert, and the kept
    # pseudo-labels' accuracy in the log (the embedded target split carries labels).
    assert set(res["per_class_accuracy"]) <= {str(d) for d in range(10)} and res["per_class_accuracy"]
    assert set(res["per_class_expert_accuracy"]) == {"hand", "blend", "font"}
    log = (out / "log.txt").read_text()
    assert "pl_acc_u" in log and "* per-class accuracy: " in log
    # TEST.PER_CLASS_RESULT: Dassl's per-class block, its average the mean over the classes tested
    average = re.findall(r"\* average: ([\d.]+)%", proc.stdout)[-1]
    per = res["per_class_accuracy"].values()
    assert "=> per-class result\n* class: 0 (0)\ttotal: " in proc.stdout
    assert float(average) == pytest.approx(sum(per) / len(per), abs=0.051)
    assert res["mean_class_accuracy"] == pytest.approx(sum(per) / len(per), abs=0.006)  # results.json's, exact
    assert f"Confusion matrix is saved to {out / 'cmat.pt'}" in proc.stdout and (out / "cmat.pt").is_file()


def test_provenance_reads_a_librarys_version_without_importing_it(monkeypatch):
    """``import timm`` costs about a second of CPU; a run whose backbone is not timm's records timm's
    version from its installed metadata instead, and a module the run has imported gives its own."""
    import timm

    from dael_plugin.engine.results import library_version

    monkeypatch.delitem(sys.modules, "timm")  # as in a run that never imported it
    assert library_version("timm") == timm.__version__ and "timm" not in sys.modules
    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(__version__="9.9"))
    assert library_version("timm") == "9.9"
    assert library_version("no_such_library_here") is None


def test_builtin_dg_and_rerun_into_a_finished_run(tmp_path, tiny_root, capsys):
    """DG has no L_u. Rerunning the same command into a finished run does nothing and says so:
    its results.json is untouched (byte for byte). Another config there is refused, as on
    resume; --retrain trains again and keeps the old files aside. (In-process: ``main`` is what
    scripts/train.py calls.)"""
    from dael_plugin.tools.train import main

    def run(argv):
        code = main(argv)
        cap = capsys.readouterr()
        return code, cap.out, cap.err

    out = tmp_path / "dg"
    cfg = os.path.join(ROOT, "configs/trainers/dg/daeldg/embedded_digits_dg.yaml")
    args = base_args(tiny_root, out, trainer="DAELDG", ds=DS_DG, cfg=cfg) + ["--engine", "builtin"] + FAST
    code, stdout, err = run(args)
    assert code == 0, err[-3000:]
    assert "setting DG" in stdout and "loss_u" not in (out / "log.txt").read_text()
    first = (out / "results.json").read_bytes()
    code, stdout, err = run(args)
    assert code == 0, err[-3000:]
    assert "holds a finished run" in stdout and "epoch [" not in stdout
    assert (out / "results.json").read_bytes() == first
    code, stdout, err = run(args + ["OPTIM.LR", "0.2"])
    assert code == 2 and "OPTIM.LR" in err and (out / "results.json").read_bytes() == first
    # A finished run of the other engine (the record says which): refused in one line, not reused.
    other = json.loads(first)
    other["engine"] = "dassl"
    (out / "results.json").write_text(json.dumps(other))
    code, stdout, err = run(args)
    assert code == 2 and "holds a finished run of the dassl engine" in err and "--engine dassl to keep it" in err
    assert "Traceback" not in err and json.loads((out / "results.json").read_text()) == other
    (out / "results.json").write_bytes(first)
    code, stdout, err = run(["--retrain"] + args)
    assert code == 0, err[-3000:]
    aside = [d for d in os.listdir(out) if d.startswith("replaced-")]
    assert len(aside) == 1 and (out / aside[0] / "results.json").read_bytes() == first
    assert json.loads((out / "results.json").read_text())["accuracy"] == json.loads(first)["accuracy"]


def test_builtin_source_only(tmp_path, tiny_root):
    out = tmp_path / "so"
    cfg = os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml")
    proc = run_train(base_args(tiny_root, out, trainer="SourceOnly", cfg=cfg) + FAST, env_hide_dassl=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["trainer"] == "SourceOnly" and res["expert_accuracy"] == {}


BAD_INPUT = [
    ("fewer than 2 sources", dict(src=("hand",)), [], "at least 2 source domains"),
    ("target among sources", dict(src=("hand", "street")), [], "also listed among the source domains"),
    ("indivisible batch", {}, ["DATALOADER.TRAIN_X.BATCH_SIZE", "100"], "not divisible by the 3 domains"),
    ("empty strong transforms", {}, ["TRAINER.DAEL.STRONG_TRANSFORMS", "()"], "STRONG_TRANSFORMS is empty"),
    ("unknown timm model", {}, ["MODEL.BACKBONE.NAME", "timm_resnet181"], "timm has no model 'resnet181'"),
    # timm raises a RuntimeError for it at build time, after the data was read (PRETRAINED False too)
    ("unknown timm tag", {}, ["MODEL.BACKBONE.NAME", "timm_resnet18.tv_in1"], "did you mean timm_resnet18.tv_in1k?"),
    ("unknown dataset", {}, ["DATASET.NAME", "Digit55"], "Digit55"),
    ("unknown domain", dict(tgt=("svhn",)), [], "has no domain 'svhn'"),
    ("unbalanced sampler", {}, ["DATALOADER.TRAIN_X.SAMPLER", "RandomSampler"], "not domain-balanced"),
    ("unknown switch value", {}, ["TRAINER.DAEL.CR_MODE", "both"], "CR_MODE must be one of"),
    ("unknown key", {}, ["TRAINER.DAEL.WEIGHT_X", "1.0"], "TRAINER.DAEL.WEIGHT_X"),
    # Dassl raises a KeyError for it as it builds the transforms
    ("unknown interpolation", {}, ["INPUT.INTERPOLATION", "cubicc"], "INPUT.INTERPOLATION='cubicc' is invalid"),
    ("unknown split", {}, ["TEST.SPLIT", "valid"], "TEST.SPLIT='valid' is invalid"),  # Dassl: test, silently
    ("a word for a number", {}, ["OPTIM.LR", "abc"], "OPTIM.LR=abc is a string; the key takes a number, as 0.05"),
    # yacs's text of the group's default, a line per key, was cut to "... with values (ADAM_BETA1: 0.9"
    (
        "a number for a group",
        {},
        ["OPTIM", "5"],
        "OPTIM=5 is a whole number; OPTIM is a group of keys (OPTIM.ADAM_BETA1",
    ),
    # each stopped in a traceback: at the first batch, or as the loaders or the optimiser were built
    ("zero pixel std", {}, ["INPUT.PIXEL_STD", "[0,0,0]"], "INPUT.PIXEL_STD=[0, 0, 0] is invalid"),
    ("two pixel means", {}, ["INPUT.PIXEL_MEAN", "[0.5,0.5]"], "INPUT.PIXEL_MEAN=[0.5, 0.5] is invalid"),
    ("negative crop padding", {}, ["INPUT.CROP_PADDING", "-4"], "INPUT.CROP_PADDING=-4 is invalid"),
    (
        "negative jitter",
        {},
        ["INPUT.COLORJITTER_B", "-1", "INPUT.TRANSFORMS", "colorjitter,normalize"],
        "must be non negative",
    ),
    ("negative momentum", {}, ["OPTIM.MOMENTUM", "-1"], "refuses it: Invalid momentum value: -1.0"),
]


# Both engines share the check functions; every case runs in-process (``cli.main`` is what
# scripts/train.py calls) on the built-in engine, and the cases that reach Dassl's own code
# on the Dassl engine. One subprocess case holds the stderr contract of the script itself.
DASSL_CASES = {
    "fewer than 2 sources",
    "unknown timm tag",
    "unknown interpolation",
    "unknown split",
    "a word for a number",
    "a number for a group",
    "zero pixel std",
    "two pixel means",
    "negative crop padding",
    "negative jitter",
    "negative momentum",
    "unknown dataset",
    "unbalanced sampler",
    "unknown key",
    "indivisible batch",
}


@pytest.mark.parametrize("case,kw,opts,message", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_gives_one_clear_line_builtin(tmp_path, tiny_root, capsys, case, kw, opts, message):
    from dael_plugin.tools.train import main

    code = main(["--engine", "builtin"] + base_args(tiny_root, tmp_path / "bad", **kw) + FAST + opts)
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.dassl
@pytest.mark.parametrize(
    "case,kw,opts,message",
    [c for c in BAD_INPUT if c[0] in DASSL_CASES],
    ids=[c[0] for c in BAD_INPUT if c[0] in DASSL_CASES],
)
def test_bad_input_gives_one_clear_line_dassl(tmp_path, tiny_root, capsys, case, kw, opts, message):
    from dael_plugin.tools.train import main

    code = main(["--engine", "dassl"] + base_args(tiny_root, tmp_path / "bad", **kw) + FAST + opts)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err
    assert not type(sys.stdout).__module__.startswith("dassl"), "Dassl's logger left on sys.stdout"


DASSL_REFUSALS = [
    # Dassl's own builders refuse these with a ValueError as the trainer is built, after the data is read
    ("DAEL", ["OPTIM.NAME", "sgdd"], "OPTIM: Dassl refuses it: optim must be one of"),
    ("DAEL", ["OPTIM.LR_SCHEDULER", "cosin"], "scheduler must be one of ['single_step', 'multi_step', 'cosine']"),
    ("DAEL", ["OPTIM.NAME", "adam", "OPTIM.ADAM_BETA1", "1.5"], "Invalid beta parameter at index 0: 1.5"),
    ("DAEL", ["TEST.EVALUATOR", "Classificaton"], "(did you mean 'Classification'?)"),
    # Dassl's trainer's own check_cfg asserts it (without M3SDA's config file the sampler is RandomSampler)
    ("M3SDA", [], 'M3SDA refuses this config: its check_cfg asserts `assert cfg.DATALOADER.TRAIN_X.SAMPLER == "Random'),
]


@pytest.mark.dassl
@pytest.mark.parametrize(
    "trainer,opts,message", DASSL_REFUSALS, ids=[" ".join(c[1][:2]) or c[0] for c in DASSL_REFUSALS]
)
def test_what_dassl_refuses_as_it_builds_a_trainer_is_one_line_before_the_data(
    tmp_path, tiny_root, capsys, trainer, opts, message
):
    from dael_plugin.tools.train import main

    args = base_args(tiny_root, tmp_path / "bad", trainer=trainer)
    if trainer != "DAEL":
        args = args[:6] + args[8:]  # no --config-file: the trainer's defaults
    code = main(["--engine", "dassl"] + args + FAST + opts)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.dassl
def test_a_dassl_engine_error_is_one_line_on_the_scripts_stderr(tmp_path, tiny_root):
    """The script itself (a subprocess): one line on stderr, exit 2, no traceback."""
    opts = ["DATALOADER.TRAIN_X.SAMPLER", "RandomSampler"]
    proc = run_train(["--engine", "dassl"] + base_args(tiny_root, tmp_path / "bad") + FAST + opts)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "not domain-balanced" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unsupported_key_on_builtin_names_the_key(tmp_path, tiny_root, capsys):
    from dael_plugin.tools.train import main

    assert (
        main(["--engine", "builtin"] + base_args(tiny_root, tmp_path / "x") + FAST + ["INPUT.NO_TRANSFORM", "True"])
        == 2
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "INPUT.NO_TRANSFORM" in last and "built-in engine does not support" in last
    assert main(["--engine", "builtin"] + base_args(tiny_root, tmp_path / "x", trainer="FixMatc") + FAST) == 2
    err = capsys.readouterr().err
    assert "'FixMatc' (did you mean FixMatch?) is not available on the built-in engine" in err, err


@pytest.mark.dassl
def test_the_list_of_dassls_keys_is_dassls():
    """config/dassl_keys.py (names only, so that a machine without Dassl tells its keys from typos)
    against the installed Dassl's defaults."""
    pytest.importorskip("dassl")
    from dassl.config import get_cfg_default

    from dael_plugin.config.dassl_keys import DASSL_KEYS
    from dael_plugin.config.keys import full_keys as _full_keys

    assert set(_full_keys(get_cfg_default())) == DASSL_KEYS


@pytest.mark.dassl
def test_the_built_in_engines_nodes_of_dassls_baselines_are_dassls():
    """Each Dassl baseline the built-in engine runs reads Dassl's own node (``TRAINER.<NAME>``) with
    Dassl's defaults, key for key and value for value, so one YAML file is one run on both engines."""
    pytest.importorskip("dassl")
    from dassl.config import get_cfg_default

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.methods import DasslBaseline, trainer_class, trainer_names

    theirs, ours = get_cfg_default().TRAINER, get_builtin_cfg().TRAINER
    nodes = {n.upper() for n in trainer_names() if issubclass(trainer_class(n), DasslBaseline)} & set(theirs)
    assert {"M3SDA", "MME", "MCD", "SE", "CROSSGRAD", "DDAIG", "DOMAINMIX"} <= nodes
    for node in sorted(nodes):
        assert dict(ours[node]) == dict(theirs[node]), node


def all_yaml_files():
    return sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True))


def test_configs_exist_for_every_promised_dataset():
    names = {os.path.relpath(p, ROOT) for p in all_yaml_files()}
    for ds in (
        "da/digit5",
        "da/mini_domainnet",
        "da/domainnet",
        "dg/pacs",
        "dg/office_home_dg",
        "dg/digits_dg",
        "da/embedded_digits",
        "dg/embedded_digits_dg",
    ):
        assert f"configs/datasets/{ds}.yaml" in names
    for tr in (
        "da/dael/digit5",
        "da/dael/domainnet",
        "da/dael/mini_domainnet",
        "dg/daeldg/pacs",
        "dg/daeldg/office_home_dg",
        "da/m3sda/digit5",
        "da/mme/digit5",
        "da/source_only/digit5",
    ):
        assert f"configs/trainers/{tr}.yaml" in names


@pytest.mark.parametrize("path", all_yaml_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shipped_yaml_merges(path):
    """Each file merges into Dassl's defaults (when installed) and, for the
    files of the trainers it runs (all of them: DAEL, SourceOnly and Dassl's M3SDA and MME), into the
    built-in engine's defaults."""
    import dael_plugin
    from dael_plugin import add_dael_config
    from dael_plugin.config.defaults import get_builtin_cfg

    with open(path) as f:
        assert isinstance(yaml.safe_load(f), dict)
    merged = 0
    if dael_plugin.HAS_DASSL:
        from dassl.config import get_cfg_default

        cfg = add_dael_config(get_cfg_default())
        cfg.merge_from_file(path)
        merged += 1
    cfg = get_builtin_cfg()
    cfg.merge_from_file(path)
    merged += 1
    assert merged


def test_a_whole_number_for_a_float_key_is_taken(tmp_path, tiny_root, capsys):
    """yacs refuses `TRAINER.DAEL.WEIGHT_U 0` (int for a float key); the CLI passes it as 0.0."""
    from test_hardening import args_for, cli

    code, _, err = cli(
        args_for(tiny_root, tmp_path / "w", extra=["TRAINER.DAEL.WEIGHT_U", "0", "OPTIM.LR", "1"]), capsys
    )
    assert code == 0, err
    res = json.loads((tmp_path / "w" / "results.json").read_text())
    merged = yaml.safe_load(res["provenance"]["config"])
    assert merged["TRAINER"]["DAEL"]["WEIGHT_U"] == 0.0 and merged["OPTIM"]["LR"] == 1.0
    code, _, err = cli(args_for(tiny_root, tmp_path / "x", extra=["OPTIM.MAX_EPOCH", "1.5"]), capsys)
    assert code == 2 and "OPTIM.MAX_EPOCH" in err  # an int key still refuses a float


def test_every_dataset_config_says_which_engine_reads_it():
    """README 'Which datasets run where' and the configs agree: a dataset the built-in engine
    cannot read says it needs Dassl, and the others are read by both."""
    from dael_plugin.data.folders import builtin_datasets

    for setting in ("da", "dg"):
        folder = os.path.join(ROOT, "configs", "datasets", setting)
        for name in sorted(os.listdir(folder)):
            text = open(os.path.join(folder, name)).read()
            tag = [line for line in text.splitlines() if line.startswith("# Engine: ")]
            dataset = next(
                line.split(":", 1)[1].strip().strip('"')
                for line in text.splitlines()
                if line.strip().startswith("NAME:") and "BACKBONE" not in line
            )
            assert len(tag) == 1, name
            assert ("needs Dassl" in tag[0]) == (dataset not in builtin_datasets()), (name, dataset, tag[0])


HOST_ALLOC = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 15032385536 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize("kind", ["gpu", "host", "cpu-allocator", "killed-loader"])
def test_out_of_memory_is_one_line_with_the_settings_to_lower(tmp_path, tiny_root, capsys, monkeypatch, kind):
    """An out-of-memory stop in a step (failure injected) is one error line naming the memory, the
    batch sizes and the way out, exit code 4 and a failed.json; no traceback."""
    import json

    import torch

    from dael_plugin.methods.dael import DAELBuiltin
    from dael_plugin.tools.train import main

    exc = {
        "gpu": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        "host": MemoryError(),
        # torch's CPU allocator raises a plain RuntimeError (what INPUT.SIZE (1024, 1024) gave here)
        "cpu-allocator": RuntimeError(HOST_ALLOC),
        "killed-loader": RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. "),
    }[kind]

    def oom(self, *a, **k):
        raise exc

    monkeypatch.setattr(DAELBuiltin, "forward_backward", oom)
    out = tmp_path / "oom"
    code = main(["--engine", "builtin"] + base_args(tiny_root, out) + FAST)
    err = capsys.readouterr().err
    assert code == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: out of {'GPU' if kind == 'gpu' else 'host'} memory"), lines[0]
    assert "DATALOADER.TRAIN_X.BATCH_SIZE" in lines[0] and "another --output-dir" in lines[0]
    assert "out of" in json.loads((out / "failed.json").read_text())["error"]


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_numbers_yacs_refused_as_a_type_mismatch_are_read_as_meant(tmp_path, tiny_root, engine):
    """An integer for a float key in a file (``LR: 1``) is that float, as on the command line; and
    ``OPTIM.SGD_DAMPNING``, whose default is Dassl's integer 0, takes a real value from a file or the
    command line (yacs refused every one: "Type mismatch (<class 'int'> vs. <class 'float'>)").
    Left unset, it stays the integer 0, so the configs of earlier runs compare equal on resume."""
    from dael_plugin.tools.train import build_parser, setup_cfg

    f = tmp_path / "optim.yaml"
    f.write_text("OPTIM:\n  LR: 1\n  SGD_DAMPNING: 0.25\n")
    base = ["--engine", engine] + base_args(tiny_root, tmp_path / "x")

    def cfg_of(*extra):
        return setup_cfg(build_parser().parse_args(base + list(extra)), engine).OPTIM

    from_file = cfg_of("--config-file", str(f))
    assert from_file.LR == 1.0 and type(from_file.LR) is float and from_file.SGD_DAMPNING == 0.25
    assert cfg_of("--", "OPTIM.SGD_DAMPNING", "0.5").SGD_DAMPNING == 0.5
    assert type(cfg_of().SGD_DAMPNING) is int and type(cfg_of("--", "OPTIM.SGD_DAMPNING", "1").SGD_DAMPNING) is int


def test_a_key_value_pair_after_a_list_flag_is_named_and_the_double_dash_works(tmp_path, tiny_root, capsys):
    from dael_plugin.tools.train import build_parser, main, setup_cfg

    args = base_args(tiny_root, tmp_path / "x") + FAST
    swallowed = args[: args.index("--output-dir")] + ["OPTIM.MAX_EPOCH", "2"] + args[args.index("--output-dir") :]
    assert main(["--engine", "builtin"] + swallowed) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'OPTIM.MAX_EPOCH' is a config key" in err[0] and "--target-domains street --" in err[0]
    # the fix it names: the list ended with --
    base = base_args(tiny_root, tmp_path / "x")
    fixed = ["--engine", "builtin"] + base + ["--target-domains", "street", "--"] + FAST + ["OPTIM.MAX_EPOCH", "2"]
    cfg = setup_cfg(build_parser().parse_args(fixed), "builtin")
    assert list(cfg.DATASET.TARGET_DOMAINS) == ["street"] and cfg.OPTIM.MAX_EPOCH == 2


def test_ctrl_c_during_eval_only_says_the_evaluation_stopped(tmp_path, tiny_root, capsys, monkeypatch):
    from dael_plugin.engine.trainer import BuiltinTrainer
    from dael_plugin.tools.train import main

    assert main(["--engine", "builtin"] + base_args(tiny_root, tmp_path / "run") + FAST) == 0

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(BuiltinTrainer, "test", interrupted)
    args = base_args(tiny_root, tmp_path / "eval") + ["--eval-only", "--model-dir", str(tmp_path / "run")] + FAST
    capsys.readouterr()
    assert main(["--engine", "builtin"] + args) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("interrupted: the evaluation stopped") and "checkpoint" not in last, last


@pytest.mark.dassl
def test_a_source_domain_smaller_than_its_batch_share_is_one_line_on_dassl(tmp_path, tiny_root):
    """Dassl's DataManager built its own RandomDomainSampler first, which stopped with a traceback
    ("Sample larger than population") before the plugin's sampler could name the domain."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    train = root / "embedded_digits" / "hand" / "train"
    for folder in train.iterdir():
        for img in sorted(folder.glob("*.png"))[1:]:
            img.unlink()  # one image per class: 10, and the batch share is 12
    big = ["DATALOADER.TRAIN_X.BATCH_SIZE", "36"]
    proc = run_here(["--engine", "dassl"] + base_args(str(root), tmp_path / "run") + FAST + big)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: source domain") and "fewer than its per-batch share of 12" in last, last


@pytest.mark.dassl
@pytest.mark.parametrize(
    "trainer, key, value, said",
    [
        ("SourceOnly", "INPUT.NO_TRANSFORM", "True", "cannot batch them"),  # Dassl's collate: a TypeError
        ("DAEL", "OPTIM.WARMUP_EPOCH", "1", "no longer takes"),  # Dassl's warm-up passes verbose to torch
        ("M3SDA", "DATALOADER.K_TRANSFORMS", "2", "takes one view of each image"),  # 'list' has no .to
        ("DAEL", "DATALOADER.K_TRANSFORMS", "2", "DAEL takes 1"),
        ("DAEL", "DATALOADER.TRAIN_U.SAMPLER", "RandomDomainSampler", "shuffled (RandomSampler)"),  # was ignored
        ("DAEL", "MODEL.INIT_WEIGHTS", DAEL_CFG, "DAEL does not read it"),  # was ignored, as Dassl's DAEL does
        ("CDAC", "TRAIN.COUNT_ITER", "train_u", "which it never sets"),  # Dassl's CDAC: an AttributeError
        pytest.param(  # Dassl's SolarizeAdd: an AttributeError, once an epoch draws it
            "SourceOnly",
            "INPUT.TRANSFORMS",
            "['randaugment', 'normalize']",
            "calls np.int",
            marks=pytest.mark.skipif(hasattr(numpy, "int"), reason="this NumPy has np.int, which Dassl's code calls"),
        ),
    ],
)
def test_values_every_dassl_trainer_stops_on_are_one_line(tmp_path, tiny_root, trainer, key, value, said):
    """Each of these stopped in a traceback on the Dassl engine (Dassl's trainers and the plugin's
    DAEL alike), or the plugin's DAEL ignored it (the two with INIT_WEIGHTS and TRAIN_U.SAMPLER):
    one line each, naming the key."""
    cfg = {"DAEL": DAEL_CFG, "CDAC": CDAC_CFG}.get(trainer, SRC_CFG)
    proc = run_here(
        ["--engine", "dassl"] + base_args(tiny_root, tmp_path / "run", trainer, cfg=cfg) + FAST + [key, value]
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {key}") and said in last, last


@pytest.mark.dassl
def test_the_dassl_trainers_that_take_several_views_are_those_whose_code_reads_the_key():
    """K_TRANSFORMS above 1 is refused for every Dassl trainer but these: held to Dassl's own code."""
    import inspect

    from dassl.engine import TRAINER_REGISTRY

    from dael_plugin.dassl_adapter.checks import DASSL_MULTI_VIEW

    dassls = [TRAINER_REGISTRY.get(n) for n in TRAINER_REGISTRY.registered_names()]
    reading = {
        c.__name__ for c in dassls if c.__module__.startswith("dassl.") and "K_TRANSFORMS" in inspect.getsource(c)
    }
    assert reading == set(DASSL_MULTI_VIEW)


def test_a_run_without_a_gpu_caps_its_data_segment_at_the_memory_available():
    """RLIMIT_DATA = what the process holds + its share of MemAvailable (Linux): past it torch's
    allocator fails with the one-line error above instead of the kernel's SIGKILL; a lower limit
    already set is kept, and the previous limits come back."""
    resource = pytest.importorskip("resource")
    from dael_plugin.config.keys import available_memory
    from dael_plugin.engine.memory import _vm_data, cap_host_memory, restore_host_memory

    if available_memory() is None or _vm_data() is None:
        pytest.skip("no /proc/meminfo or /proc/self/status here")
    before = resource.getrlimit(resource.RLIMIT_DATA)
    previous = cap_host_memory(2)
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        expected = _vm_data() + available_memory() // 2
        assert previous == before and abs(soft - expected) < 2**30, (soft, expected)  # MemAvailable moves a little
        assert hard == before[1]
        assert cap_host_memory(1) is None  # a lower limit is kept
    finally:
        restore_host_memory(previous)
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


@pytest.mark.dassl
def test_the_plugins_dael_is_the_same_run_bit_for_bit_on_both_engines(tmp_path, tiny_root):
    """One config, one seed: the built-in engine and Dassl's loop give the same weights, bit for
    bit (the same sampler plan, Dassl's transforms, per-draw seeding); scripts/fidelity.py found
    it over 15 epochs on miniDomainNet's reader too. The strong view is Dassl's randaugment2."""
    strong = ["TRAINER.DAEL.STRONG_TRANSFORMS", "['randaugment2', 'normalize']"]
    weights = {}
    for engine in ("builtin", "dassl"):
        out = tmp_path / engine
        proc = run_here(["--engine", engine] + base_args(tiny_root, out) + FAST + strong)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if engine == "builtin":
            weights[engine] = torch.load(out / "model.pth.tar-1", map_location="cpu", weights_only=True)["model"]
        else:
            f = torch.load(out / "F" / "model.pth.tar-1", map_location="cpu", weights_only=True)["state_dict"]
            e = torch.load(out / "E" / "model.pth.tar-1", map_location="cpu", weights_only=True)["state_dict"]
            weights[engine] = {"F." + k.removeprefix("backbone."): v for k, v in f.items()}
            weights[engine].update({"E." + k: v for k, v in e.items()})
    ours, theirs = weights["builtin"], weights["dassl"]
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), [k for k in ours if not torch.equal(ours[k], theirs[k])]


def test_seed_minus_one_draws_one_seed_uses_it_everywhere_and_records_it(tmp_path, tiny_root):
    """``--seed -1``: one seed is drawn, said, and recorded in results.json; the run it names is
    the one ``--seed N`` gives (torch's weights, the batches and views: before, torch was left
    unseeded and the data drawn from seed 0). CLASSIFIER single names no expert after a source."""
    single = ["TRAINER.DAEL.CLASSIFIER", "single"]
    args = base_args(tiny_root, tmp_path / "drawn")
    args[args.index("--seed") + 1] = "-1"
    proc = run_here(["--engine", "builtin"] + args + FAST + single)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seed = json.load(open(tmp_path / "drawn" / "results.json"))["seed"]
    assert seed >= 0 and f"SEED -1: drew seed {seed}" in proc.stdout
    assert "* expert accuracy: hand" not in proc.stdout
    refused = [a if a != "street" else "streets" for a in args]  # a domain the dataset lacks
    proc = run_here(["--engine", "builtin"] + refused + FAST)
    assert proc.returncode == 2 and "streets" in proc.stderr and "SEED -1" not in proc.stdout  # its refusal alone
    (tmp_path / "drawn" / "results.json").unlink()  # as if killed after its last checkpoint: resumes its seed
    proc = run_here(["--engine", "builtin"] + args + FAST + single)
    assert proc.returncode == 0 and f"SEED -1: the seed {seed} this run drew" in proc.stdout, proc.stderr[-2000:]
    args = base_args(tiny_root, tmp_path / "again")
    args[args.index("--seed") + 1] = str(seed)
    assert run_here(["--engine", "builtin"] + args + FAST + single).returncode == 0
    a = torch.load(tmp_path / "drawn" / "model.pth.tar-1", weights_only=True)["model"]
    b = torch.load(tmp_path / "again" / "model.pth.tar-1", weights_only=True)["model"]
    assert all(torch.equal(v, b[k]) for k, v in a.items())


def test_another_trainer_into_a_finished_runs_folder_is_named_in_one_line(tmp_path, tiny_root):
    """``--trainer MME`` into a finished DAEL folder: one line saying whose run the folder holds,
    that it finished, and what to pass (it listed 25 key differences and "cannot resume")."""
    out = tmp_path / "run"
    assert run_here(["--engine", "builtin"] + base_args(tiny_root, out) + FAST).returncode == 0
    mme = base_args(
        tiny_root, out, trainer="MME", cfg=os.path.join(ROOT, "configs/trainers/da/mme/embedded_digits.yaml")
    )
    proc = run_here(["--engine", "builtin"] + mme + FAST)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "is a DAEL run that finished (1 epochs), not MME" in line, proc.stderr[-1500:]
    assert "--output-dir" in line and "differs" not in line


def test_a_group_of_keys_where_a_value_goes_is_one_whole_line(tmp_path):
    """yacs words a mismatch with a group (its keys, a line each) over several lines; the line
    said was cut at the first (`... with values (ADAM_BETA1: 0.9`). Both ways round, one whole line."""
    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.errors import DAELConfigError
    from dael_plugin.tools.train_config import merge_file

    for text, said in (
        ("OPTIM: 5\n", "OPTIM=5 is a whole number; OPTIM is a group of keys (OPTIM.ADAM_BETA1, ...): set one of them"),
        ("OPTIM:\n  LR:\n    a: 1\n    b: 2\n", "OPTIM.LR={a: 1, b: 2} is a group of keys; the key takes a number, as"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(DAELConfigError) as info:
            merge_file(get_builtin_cfg(), str(path), "builtin")
        assert said in str(info.value) and "\n" not in str(info.value), str(info.value)
