"""scripts/sweep.py and scripts/collect.py on a cut-down grid (built-in engine, 1 epoch)."""

import csv
import json
import os
import re

import pytest

from conftest import ROOT

DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
FAST = [
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
    "TEST.NO_TEST",
    "False",
    # no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
    "SELECTION.EVAL_FREQ",
    "0",
]


def sweep(argv, capsys):
    from dael_plugin.tools.sweep import main

    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def base(root, out, *extra):
    return ["--root", root, "--dataset-config-file", DS, "--output-dir", str(out), "--engine", "builtin", *extra]


def test_the_plan(tmp_path, capsys):
    code, out, _ = sweep(
        base(
            "data",
            tmp_path,
            "--trainers",
            "DAEL",
            "SourceOnly",
            "--seeds",
            "1",
            "2",
            "--grid",
            "TRAINER.DAEL.WEIGHT_U",
            "0",
            "0.5",
            "--dry-run",
            *FAST,
        ),
        capsys,
    )
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("  [")]
    # DAEL: 4 targets x 2 weights x 2 seeds; SourceOnly does not read TRAINER.DAEL.*: 4 x 2.
    assert len(lines) == 16 + 8 and out.startswith("sweep: 24 runs (0 done, 24 to run)")
    assert any(ln.endswith(os.path.join("EmbeddedDigits", "DAEL", "WEIGHT_U=0.5", "blend", "seed2")) for ln in lines)
    assert any(ln.endswith(os.path.join("EmbeddedDigits", "SourceOnly", "font", "seed1")) for ln in lines)
    from dael_plugin.tools.sweep import build_parser, plan, split_opts

    flags, opts = split_opts(base("data", tmp_path, "--trainers", "DAEL", "--targets", "blend", *FAST))
    assert opts == FAST
    assert split_opts(["--grid", "OPTIM.LR", "0.1", "--", "SEED", "3"]) == (
        ["--grid", "OPTIM.LR", "0.1"],
        ["SEED", "3"],
    )
    args = build_parser().parse_args(flags)
    args.opts = opts
    args.root, args.output_dir = os.path.abspath(args.root), os.path.abspath(args.output_dir)
    (run,) = plan(args)
    assert run.sources == ("hand", "street", "font") and run.config_file.endswith(
        os.path.join("configs", "trainers", "da", "dael", "embedded_digits.yaml")
    )
    assert list(run.argv[-len(FAST) :]) == FAST


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--trainers", "DAEL", "--targets", "mars"], "not domains of EmbeddedDigits"),
        (["--trainers", "DAEL", "--grid", "OPTIM.LR"], "--grid OPTIM.LR has no values"),
        (["--trainers", "Nope"], "no method config for Nope"),
        (
            ["--trainers", "DAEL", "OPTIM.LR", "0.1", "--workers", "2"],
            "--workers comes after the KEY VALUE options OPTIM.LR",
        ),
        (["--trainers", "DAEL", "--workers", "0"], "--workers 0: give at least 1"),
        (["--trainers", "DAEL", "--seeds", "1", "1"], "--seeds names 1 twice"),
        (["--trainers", "DAEL", "--seeds", "-5"], "--seeds -5: a seed is a whole number from 0"),
        (["--trainers", "DAEL", "--config", "DAEL=/nonexistent.yaml"], "--config DAEL=/nonexistent.yaml: no such file"),
        (["--trainers", "DAEL", "DAEL"], "--trainers names DAEL twice"),
        (["--trainers", "DAEL", "--grid", "OPTIM.LR", "0.1", "0.1"], "--grid OPTIM.LR names 0.1 twice"),
        (
            ["--trainers", "DAEL", "--grid", "OPTIM.LR", "0.1", "0.10", "1e-1"],
            "--grid OPTIM.LR lists one value more than once (0.1 0.10 1e-1 are all 0.1)",
        ),
        # what every run of a setting would refuse at once, read as its runs read it, before any is launched
        (
            ["--trainers", "SourceOnly", "DAEL", "--grid", "OPTIM.LRR", "0.1", "0.01"],
            "SourceOnly[LRR=0.1] -> hand would stop at once (no run was launched): the command line sets "
            "OPTIM.LRR, which is not a config key; did you mean OPTIM.LR?",
        ),
        (
            ["--trainers", "DAEL", "--grid", "OPTIM.LR", "0.05", "-1"],
            "DAEL[LR=-1] -> hand would stop at once (no run was launched): OPTIM.LR=-1.0 is invalid",
        ),
        (
            ["--trainers", "M3SDA", "--targets", "blend", "TRAINER.M3SDA.LMDA", "x"],
            "M3SDA -> blend would stop at once (no run was launched): the command line: TRAINER.M3SDA.LMDA=x",
        ),
        (
            ["--trainers", "DAEL", "M3SDA", "--targets", "blend", "--gpus-per-run", "2"],
            "M3SDA -> blend would stop at once (no run was launched): M3SDA on the built-in engine runs on one process",
        ),
    ],
)
def test_bad_sweeps_are_one_line(tmp_path, capsys, argv, msg):
    code, _, err = sweep(base("data", tmp_path, "--dry-run", *argv), capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not tmp_path.joinpath("EmbeddedDigits").exists()
    assert "WORLD_SIZE" not in os.environ  # the check of a run of N processes leaves none behind


def test_missing_data_is_refused_before_a_local_sweep_not_a_slurm_one(tmp_path, capsys):
    """The dataset's file lists are read before a local sweep launches its runs; a Slurm sweep
    plans without them (a compute node may hold data its submitting host lacks)."""
    argv = ["--root", str(tmp_path / "nodata"), "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/digit5.yaml"),
            "--output-dir", str(tmp_path / "out"), "--engine", "builtin", "--trainers", "DAEL", "--targets", "mnist",
            "--dry-run"]  # fmt: skip
    code, _, err = sweep(argv, capsys)
    assert code == 2 and "DAEL -> mnist would stop at once (no run was launched): dataset folder " in err, err
    code, out, _ = sweep(argv + ["--launcher", "slurm"], capsys)
    assert code == 0 and "[   new] DAEL -> mnist seed 1" in out, out


@pytest.mark.parametrize("kind", ["fifo", "truncated"])
def test_a_hostile_settings_file_in_a_run_folder_is_one_line(tmp_path, capsys, kind):
    """A run folder's ``sweep_run.json`` that is a FIFO (a plain ``open`` blocks until a writer
    comes: the sweep hung) or a truncated file: the sweep refuses in one line naming it, and
    leaves the folder as it is."""
    argv = base("data", tmp_path, "--trainers", "SourceOnly", "--targets", "blend", "--dry-run", *FAST)
    code, out, _ = sweep(argv, capsys)
    folder = out.strip().splitlines()[-1].split()[-1]
    os.makedirs(folder)
    path = os.path.join(folder, "sweep_run.json")
    os.mkfifo(path) if kind == "fifo" else open(path, "w").write('{"trainer": "Sourc')
    code, _, err = sweep(argv, capsys)
    said = "is not a regular file" if kind == "fifo" else "is truncated or not JSON"
    assert code == 2 and f"its sweep_run.json {said}" in err and len(err.strip().splitlines()) == 1, err


def test_local_sweep_skips_done_runs_and_resumes_an_interrupted_one(tmp_path, tiny_root, capsys):
    argv = base(tiny_root, tmp_path, "--trainers", "DAEL", "SourceOnly", "--targets", "street", "--workers", "2", *FAST)
    code, out, _ = sweep(argv, capsys)
    assert code == 0, out
    assert out.count("done   ") == 2 and "sweep: 2 of 2 runs finished" in out
    code, out, _ = sweep(argv, capsys)  # relaunched: nothing to run
    assert code == 0 and "(2 done, 0 to run)" in out
    run = tmp_path / "EmbeddedDigits" / "DAEL" / "street" / "seed1"
    (run / "results.json").unlink()  # as if killed after its last checkpoint
    code, out, _ = sweep(argv, capsys)
    assert code == 0 and "(1 done, 1 to run)" in out and (run / "results.json").exists()
    assert "will resume training from epoch 2" in (run / "sweep_log.txt").read_text()


def test_init_weights_from_gives_each_target_and_seed_its_own_source_model(tmp_path, tiny_root, capsys):
    """``--init-weights-from SWEEP_DIR``: ADDA and AdaBN each start from the finished SourceOnly
    run of their own target and seed (a single MODEL.INIT_WEIGHTS for every target ran target
    street from a model trained on street's labels); a target without one is refused before any
    run, and the run's folder records which file it started from."""
    src = tmp_path / "src"
    code, out, _ = sweep(base(tiny_root, src, "--trainers", "SourceOnly", "--targets", "street", *FAST), capsys)
    assert code == 0, out
    ada = tmp_path / "ada"
    argv = base(tiny_root, ada, "--trainers", "AdaBN", "--targets", "street", "--init-weights-from", str(src), *FAST)
    code, out, err = sweep(argv, capsys)
    assert code == 0, out + err
    model = src / "EmbeddedDigits" / "SourceOnly" / "street" / "seed1" / "model.pth.tar-1"
    log = (ada / "EmbeddedDigits" / "AdaBN" / "street" / "seed1" / "sweep_log.txt").read_text()
    assert f"Loaded the source model from {model}" in log
    ident = json.load(open(ada / "EmbeddedDigits" / "AdaBN" / "street" / "seed1" / "sweep_run.json"))
    assert ident["init weights"].startswith(str(model))
    argv = base(tiny_root, tmp_path / "b", "--trainers", "AdaBN", "--targets", "street", "blend",
                "--init-weights-from", str(src), *FAST)  # fmt: skip
    code, _, err = sweep(argv, capsys)
    assert code == 2 and "no finished SourceOnly run for target blend seed 1" in err
    assert not (tmp_path / "b").exists()


def test_submitit_local_sweep_and_a_failed_run(tmp_path, tiny_root, capsys):
    """One submitit-local sweep, two jobs side by side: a grid over the rate, one of
    which (1e30) diverges in its first batches. The good run finishes, the bad one is reported
    with its log, and the exit code is 1; relaunched, only the failed run is tried again."""
    pytest.importorskip("submitit")
    argv = base(
        tiny_root,
        tmp_path,
        "--trainers",
        "SourceOnly",
        "--targets",
        "street",
        "--grid",
        "OPTIM.LR",
        "0.05",
        "1e30",
        "--launcher",
        "submitit-local",
        "--workers",
        "2",
        *FAST,
    )
    code, out, _ = sweep(argv, capsys)
    assert code == 1, out
    assert out.count("done   ") == 1 and "done   SourceOnly[LR=0.05] -> street seed 1: accuracy " in out, out
    log = tmp_path / "EmbeddedDigits" / "SourceOnly" / "LR=1e30" / "street" / "seed1" / "sweep_log.txt"
    # the run's own line, read from the end of its log
    said = re.search(r"FAILED SourceOnly\[LR=1e30\] -> street seed 1: exit 3: (.*) \(log (.*)\)", out)
    assert said and said[2] == str(log), out
    assert said[1].startswith("error: the loss became NaN/inf at epoch 1 (by batch ") and said[1] in log.read_text()
    assert (tmp_path / ".submitit").is_dir()
    code, out, _ = sweep(argv[: -len(FAST)] + ["--dry-run"] + FAST, capsys)
    assert code == 0 and "(1 done, 1 to run)" in out, out


def test_a_run_stopped_by_its_config_is_failed_in_the_table_not_still_to_come(tmp_path, tiny_root, capsys):
    """DAEL launched with one source stops at its config (exit 2) before it trains. Its folder held no
    failed.json, so collect called it 'missing' and --select 'not finished', a run still to come: now
    it says failed. A folder holding another run's checkpoint is never so marked, nor is --eval-only's."""
    from dael_plugin.tools.collect import main
    from dael_plugin.tools.train import main as train

    argv = base(tiny_root, tmp_path, "--trainers", "DAEL", "--sources", "hand", "--targets", "blend", *FAST)
    code, out, _ = sweep(argv, capsys)
    run = tmp_path / "EmbeddedDigits" / "DAEL" / "blend" / "seed1"
    assert code == 1 and "exit 2: error: DAEL needs at least 2 source domains" in out, out
    assert "DAEL needs at least 2 source domains" in json.loads((run / "failed.json").read_text())["error"]
    assert main([str(tmp_path)]) == 0 and "| failed |" in capsys.readouterr().out

    held = tmp_path / "held"
    held.mkdir()
    (held / "checkpoint.pth.tar").write_bytes(b"another run's")
    one_source = ["--root", tiny_root, "--dataset-config-file", DS, "--trainer", "DAEL", "--engine", "builtin"]
    one_source += ["--source-domains", "hand", "--target-domains", "blend"]
    (tmp_path / "ev").mkdir()
    for folder, flags in ((held, []), (tmp_path / "ev", ["--eval-only", "--model-dir", str(held)])):
        assert train(one_source + ["--output-dir", str(folder), *flags]) == 2
        assert not (folder / "failed.json").exists(), folder


def _record(root, dataset, trainer, target, seed, acc, setting=None, **more):
    d = os.path.join(root, dataset, trainer, *([setting] if setting else []), target, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "results.json"), "w") as f:
        rec = {"dataset": dataset, "trainer": trainer, "target_domains": [target], "accuracy": acc, "seed": seed}
        json.dump(dict(rec, **more), f)
    return d


def test_collect_the_mean_class_accuracy(tmp_path, capsys):
    """``--metric mean_class_accuracy`` (VisDA-2017's figure): each cell the records' own field, in a
    table and files of its own (results.md, the accuracy table, stays); with --select, the chosen
    epoch's; a record that has no such field (written before it existed) is one line naming it,
    not a cell of accuracies; --paper (accuracies) is refused with it."""
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    for seed, (acc, mean_class) in enumerate([(70.0, 60.0), (72.0, 64.0)], 1):
        d = _record(root, "VisDA17", "SourceOnly", "real", seed, acc, mean_class_accuracy=mean_class)
        with open(os.path.join(d, "epochs.jsonl"), "w") as f:
            for e, (a, m) in enumerate([(acc - 5, mean_class - 5), (acc, mean_class)], 1):
                f.write(
                    json.dumps({"epoch": e, "target_test_accuracy": a, "target_test_mean_class_accuracy": m}) + "\n"
                )
    assert main([root, "--metric", "mean_class_accuracy"]) == 0
    out = capsys.readouterr().out
    assert "target test mean class accuracy (%)" in out and "| SourceOnly | 62.00 ± 2.83 | 62.00 |" in out
    assert os.path.isfile(os.path.join(root, "results_mean_class_accuracy.csv"))
    assert not os.path.exists(os.path.join(root, "results.md"))
    assert main([root]) == 0 and "| SourceOnly | 71.00 ± 1.41 | 71.00 |" in capsys.readouterr().out
    assert main([root, "--select", "last", "--metric", "mean_class_accuracy"]) == 0
    out = capsys.readouterr().out
    assert "mean class accuracy" in out and "62.00 ± 2.83" in out
    assert main([root, "--paper", "--metric", "mean_class_accuracy"]) == 2
    assert "the paper's numbers are accuracies" in capsys.readouterr().err
    old = _record(root, "VisDA17", "SourceOnly", "real", 3, 71.0)
    assert main([root, "--metric", "mean_class_accuracy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {os.path.join(old, 'results.json')} records no mean_class_accuracy (written before the plugin "
        "recorded it); rerun it, or collect --metric accuracy"
    )


def test_collect_the_macro_f1(tmp_path, capsys):
    """``--metric macro_f1`` (iWildCam-WILDS's figure): each cell the records' own field, never their
    accuracy or mean class accuracy; with --select, the chosen epoch's ``target_test_macro_f1``."""
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    for seed, (acc, f1) in enumerate([(70.0, 30.0), (72.0, 36.0)], 1):
        d = _record(root, "IWildCam", "Vanilla", "test", seed, acc, macro_f1=f1, mean_class_accuracy=50.0)
        with open(os.path.join(d, "epochs.jsonl"), "w") as f:
            for e, (a, m) in enumerate([(acc - 5, f1 - 5), (acc, f1)], 1):
                f.write(json.dumps({"epoch": e, "target_test_accuracy": a, "target_test_macro_f1": m}) + "\n")
    assert main([root, "--metric", "macro_f1"]) == 0
    out = capsys.readouterr().out
    assert "target test macro f1 (%)" in out and "| Vanilla | 33.00 ± 4.24 | 33.00 |" in out
    assert os.path.isfile(os.path.join(root, "results_macro_f1.csv"))
    assert main([root, "--select", "last", "--metric", "macro_f1"]) == 0
    assert "33.00 ± 4.24" in capsys.readouterr().out


def test_runs_of_other_sources_for_one_target_are_another_row_never_more_seeds(tmp_path, capsys):
    """Hand-worked: PACS's leave-one-domain-out runs of seeds 1 and 2 (sketch 80 and 82), and a run
    of seed 3 on two sources for sketch (50). Read as seeds of one cell, sketch would be 70.67 over 3
    seeds, a figure of no one setting; here the two source sets are two rows, in the tables and under
    --select (which would otherwise take seed 3's run as that seed's only setting). Runs on fixed
    sources for two targets stay one row (split by the domains each read, they were two)."""
    from dael_plugin.tools.collect import main

    root, every = str(tmp_path), ["art_painting", "cartoon", "photo", "sketch"]
    for seed, acc in ((1, 80.0), (2, 82.0)):
        for target in every:
            d = _record(root, "PACS", "DAELDG", target, seed, acc, source_domains=[x for x in every if x != target])
            open(os.path.join(d, "epochs.jsonl"), "w").write(
                json.dumps({"epoch": 1, "target_test_accuracy": acc}) + "\n"
            )
    d = _record(root, "PACS", "DAELDG", "sketch", 3, 50.0, source_domains=["art_painting", "photo"])
    open(os.path.join(d, "epochs.jsonl"), "w").write(json.dumps({"epoch": 1, "target_test_accuracy": 50.0}) + "\n")
    # fixed sources for two targets (another sweep's shape): one row, as ever
    for seed, target in ((1, "cartoon"), (2, "cartoon"), (1, "sketch"), (2, "sketch")):
        d = _record(root, "PACS", "Vanilla", target, seed, 60.0 + seed, source_domains=["art_painting", "photo"])
        open(os.path.join(d, "epochs.jsonl"), "w").write(json.dumps({"epoch": 1, "target_test_accuracy": 60.0 + seed}))
    for argv in ([], ["--select", "last"]):
        assert main([root, *argv]) == 0, argv
        out = capsys.readouterr().out
        rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| DAELDG")}
        assert len(rows) == 2 and "70.67" not in out, (argv, out)
        whole = rows[f"DAELDG [domains={every}]"]
        two = rows["DAELDG [domains=['art_painting', 'photo', 'sketch']]"]
        assert whole.split(" | ")[4].startswith("81.00 ± 1.41") and "50.00" in two.split(" | ")[4], (argv, out)
        fixed = [line.split(" | ") for line in out.splitlines() if line.startswith("| Vanilla")]
        assert len(fixed) == 1 and fixed[0][2].startswith("61.50") and fixed[0][4].startswith("61.50"), (argv, out)


def test_collect_table_with_missing_and_failed_runs(tmp_path, capsys):
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    for seed, (a, b) in enumerate([(70.0, 80.0), (72.0, 84.0)], 1):
        _record(root, "EmbeddedDigits", "DAEL", "blend", seed, a)
        _record(root, "EmbeddedDigits", "DAEL", "street", seed, b)
        _record(root, "EmbeddedDigits", "SourceOnly", "blend", seed, a - 10)
    _record(root, "EmbeddedDigits", "DAEL", "blend", 1, 60.0, setting="WEIGHT_U=0")
    failed = os.path.join(root, "EmbeddedDigits", "SourceOnly", "street", "seed1")
    os.makedirs(failed)
    open(os.path.join(failed, "failed.json"), "w").write("{}")
    assert main([root]) == 0
    out = capsys.readouterr().out
    assert "| DAEL | 71.00 ± 1.41 | 82.00 ± 2.83 | 76.50 |" in out
    assert "| SourceOnly | 61.00 ± 1.41 | failed | — |" in out
    assert "| DAEL/WEIGHT_U=0 | 60.00 ± 0.00 (n=1) | missing | — |" in out
    rows = list(csv.reader(open(os.path.join(root, "results.csv"))))
    assert rows[0] == ["dataset", "setting", "row", "target", "mean", "std", "n", "state"]
    assert ["EmbeddedDigits", "DA", "SourceOnly", "street", "", "", "0", "failed"] in rows
    assert os.path.isfile(os.path.join(root, "results.md"))


def _launched(run_dir, target, seed, options, sources="hand font"):
    """The sweep_run.json a sweep writes in a run folder (its launch settings)."""
    launch = {"trainer": "DAEL", "target": target, "seed": str(seed), "sources": sources, "options": options}
    with open(os.path.join(run_dir, "sweep_run.json"), "w") as f:
        json.dump(dict(launch, engine="builtin"), f)


def test_a_run_without_a_record_is_counted_in_its_own_settings_row(tmp_path, capsys):
    """Hand-worked: two sweeps into one root, OPTIM.MAX_EPOCH 2 (seeds 1-2) and 4 (seeds 3-4), make
    two DAEL rows. Street seed 2 failed (MAX_EPOCH 2), blend seed 4 never finished (MAX_EPOCH 4), and
    a third sweep's only run (MAX_EPOCH 8, blend seed 5) failed. Each is counted in its own
    setting's cell, found by its sweep_run.json; counted in the label's first row (as before), the
    MAX_EPOCH 2 row would read 'blend [1 not done]' and MAX_EPOCH 4's blend would look complete. In
    PACS's leave-one-domain-out runs beside two-source runs (rows split by the domains read), a
    failed run goes to the row of its sources."""
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    config = "OPTIM:\n  MAX_EPOCH: {}\n"
    for epochs, runs in (
        (2, [("blend", 1, 70.0), ("blend", 2, 72.0), ("street", 1, 80.0)]),
        (4, [("blend", 3, 90.0), ("street", 3, 95.0), ("street", 4, 97.0)]),
    ):
        for target, seed, acc in runs:
            d = _record(root, "EmbeddedDigits", "DAEL", target, seed, acc, provenance={"config": config.format(epochs)})
            _launched(d, target, seed, f"OPTIM.MAX_EPOCH={epochs}")
    for target, seed, epochs, kind in (
        ("street", 2, 2, "failed.json"),
        ("blend", 4, 4, "sweep_log.txt"),
        ("blend", 5, 8, "failed.json"),
    ):
        d = os.path.join(root, "EmbeddedDigits", "DAEL", target, f"seed{seed}")
        os.makedirs(d)
        open(os.path.join(d, kind), "w").write("{}")
        _launched(d, target, seed, f"OPTIM.MAX_EPOCH={epochs}")
    assert main([root]) == 0
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[1:3]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| DAEL")
    }
    assert rows == {
        "DAEL [MAX_EPOCH=2]": ["71.00 ± 1.41", "80.00 ± 0.00 (n=1) [1 not done]"],
        "DAEL [MAX_EPOCH=4]": ["90.00 ± 0.00 (n=1) [1 not done]", "96.00 ± 1.41"],
        "DAEL [runs without a record of their setting]": ["failed", "missing"],
    }, rows

    # a DG method of the user's own (not loaded here, so its class cannot say DG): its failed run
    # is in the DG table beside its finished ones, not a DA table of its own
    for seed, name in ((1, "results.json"), (2, "failed.json")):
        d = os.path.join(root, "EmbeddedDigits", "MyDG", "blend", f"seed{seed}")
        os.makedirs(d)
        rec = {"dataset": "EmbeddedDigits", "trainer": "MyDG", "setting": "DG", "seed": seed, "accuracy": 50.0}
        json.dump(dict(rec, target_domains=["blend"]) if seed == 1 else {}, open(os.path.join(d, name), "w"))
        _launched(d, "blend", seed, "")
    assert main([root]) == 0
    out = capsys.readouterr().out
    assert "| MyDG | 50.00 ± 0.00 [1 not done] |" in out and out.count("### EmbeddedDigits") == 2, out

    pacs, every = str(tmp_path / "pacs"), ["art_painting", "cartoon", "photo", "sketch"]
    for seed, target, sources in (
        (1, "sketch", every[:3]),
        (2, "sketch", every[:3]),
        (3, "sketch", ["art_painting", "photo"]),
        (1, "cartoon", ["art_painting", "photo", "sketch"]),
    ):
        d = _record(pacs, "PACS", "DAEL", target, seed, 80.0 + seed, source_domains=sources)
        _launched(d, target, seed, "", " ".join(sources))
    for seed, target, sources in (
        (4, "sketch", ["art_painting", "photo"]),
        (4, "cartoon", ["art_painting", "photo", "sketch"]),
    ):
        d = os.path.join(pacs, "PACS", "DAEL", target, f"seed{seed}")
        os.makedirs(d)
        open(os.path.join(d, "failed.json"), "w").write("{}")
        _launched(d, target, seed, "", " ".join(sources))
    assert main([pacs]) == 0
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[1:3]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| DAEL")
    }
    assert rows == {  # cartoon, sketch
        f"DAEL [domains={every}]": ["81.00 ± 0.00 [1 not done]", "81.50 ± 0.71 (n=2)"],
        "DAEL [domains=['art_painting', 'photo', 'sketch']]": ["missing", "83.00 ± 0.00 [1 not done]"],
    }, rows


def test_collect_adds_the_papers_numbers(tmp_path, capsys):
    from dael_plugin.tools.collect import main

    _record(str(tmp_path), "Digit5", "DAEL", "mnist_m", 1, 93.0)
    assert main([str(tmp_path), "--paper", "--latex"]) == 0
    out = capsys.readouterr().out
    assert "paper rows: Table 1a (Digit-5)" in out
    assert "| DAEL (paper) | 93.77 ± 0.12 |" in out and "| M3SDA (paper) | 82.15 ± 0.49 |" in out
    assert "\\begin{tabular}" in out and "$\\pm$" in out


def test_slurm_array_is_submitted_with_the_flags_and_no_wait(tmp_path, capsys, monkeypatch):
    """The slurm launcher without a cluster: a stand-in `sbatch` records the job
    array's submission file. The flags reach it as #SBATCH lines, --no-wait exits
    after submitting, each run keeps its job id, and --dry-run shows it."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {record}\necho "Submitted batch job 4242"\n')
    (bin_dir / "sbatch").chmod(0o755)
    out_dir = tmp_path / "sweep"
    slurm_args = ["--launcher", "slurm", "--no-wait", *FAST]
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(bin_dir))  # no srun: one line
    code, _, err = sweep(base("data", out_dir, "--trainers", "DAEL", "--targets", "blend", *slurm_args), capsys)
    assert code == 2 and err.startswith("error: --launcher slurm needs a Slurm cluster") and err.count("\n") == 1, err
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{path}")
    argv = base(
        "data",
        out_dir,
        "--trainers",
        "DAEL",
        "--targets",
        "blend",
        "street",
        "--seeds",
        "1",
        "2",
        "--launcher",
        "slurm",
        "--partition",
        "gpu-a100",
        "--time",
        "90",
        "--gpus",
        "1",
        "--cpus",
        "6",
        "--workers",
        "3",
        "--no-wait",
        *FAST,
    )
    code, out, err = sweep(argv, capsys)
    assert code == 0, out + err
    text = record.read_text()
    for line in (
        "#SBATCH --partition=gpu-a100",
        "#SBATCH --time=90",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=6",
        "#SBATCH --array=0-3%3",
    ):
        assert line in text, text
    run = out_dir / "EmbeddedDigits" / "DAEL" / "street" / "seed2"
    assert out.count("submitted DAEL -> ") == 4 and f"Slurm job 4242_3; log {run / 'sweep_log.txt'}" in out, out
    assert "sweep: 4 runs submitted" in out
    assert (run / "sweep_job.txt").read_text() == "4242_3\n"
    code, out, _ = sweep(argv[: -len(FAST) - 1] + ["--dry-run"] + FAST, capsys)
    assert code == 0 and f"[   new] DAEL -> street seed 2: {run} (submitted as Slurm job 4242_3)" in out, out
    code, _, err = sweep(base("data", out_dir, "--trainers", "DAEL", "--no-wait", "--dry-run"), capsys)
    assert code == 2 and "--no-wait is for --launcher slurm" in err


def test_an_interrupted_submitit_job_is_requeued_and_its_run_resumes(tmp_path, tiny_root):
    """What Slurm does near a job's time limit (or on preemption), through submitit's
    local executor: the USR2 signal makes the job stop its run as Ctrl-C does and
    requeue itself; the requeued job resumes the run from its last checkpoint."""
    submitit = pytest.importorskip("submitit")
    import time

    from dael_plugin.tools.sweep import LOG, RunJob, build_parser, plan

    args = build_parser().parse_args(base(tiny_root, tmp_path, "--trainers", "SourceOnly", "--targets", "street"))
    # 6 epochs of about 0.3 s: the run is stopped (SIGSTOP) at its first checkpoint, so that it
    # cannot finish before the signal comes however loaded the machine is (with 40 epochs and
    # no stop, the resumed run cost 12 s of CPU).
    args.opts = FAST[:1] + ["6"] + FAST[2:]
    args.root, args.output_dir = os.path.abspath(args.root), os.path.abspath(args.output_dir)
    args.dataset_config_file = os.path.abspath(args.dataset_config_file)
    (run,) = plan(args)
    ex = submitit.LocalExecutor(folder=str(tmp_path / ".submitit" / "%j"))
    ex.update_parameters(timeout_min=10)
    job = ex.submit(RunJob(), list(run.argv), run.output_dir, {"OMP_NUM_THREADS": "1"})
    ckpt = os.path.join(run.output_dir, "checkpoint.pth.tar")
    deadline = time.time() + 120
    while not os.path.isfile(ckpt) and time.time() < deadline:
        time.sleep(0.05)
    assert os.path.isfile(ckpt), open(os.path.join(run.output_dir, LOG)).read()[-2000:]
    # Slurm signals the job's task (submitit's process, the parent of train.py) with USR2,
    # as submitit's local controller does at its time limit: do what they do.
    import signal

    with open(os.path.join(run.output_dir, ".dael_run.json")) as f:
        train_pid = json.load(f)["pid"]
    os.kill(train_pid, signal.SIGSTOP)  # the signal the task passes on waits for SIGCONT
    try:
        with open(f"/proc/{train_pid}/stat") as f:
            task_pid = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(task_pid, signal.SIGUSR2)
        time.sleep(1)  # the task's handler passes the stop on to the stopped run
    finally:
        os.kill(train_pid, signal.SIGCONT)
    assert job.result() == 0
    log = open(os.path.join(run.output_dir, LOG)).read()
    assert "sweep: job interrupted (time limit or preemption); requeued, the run resumes" in log, log[-3000:]
    assert log.count("$ ") == 2 and "will resume training from epoch" in log, log[-3000:]
    assert json.load(open(os.path.join(run.output_dir, "results.json")))["epochs"] == 6


def test_a_sweep_from_a_wheel_installed_outside_the_checkout(tmp_path, tiny_root):
    """The installed package runs on its own: the sweep's runs are ``python -m
    dael_plugin.tools.train`` on the installed code (not scripts/train.py of a checkout), and the
    method config is found in the dataset config's own tree, wherever that is."""
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    for name in ("dael_plugin", "setup.cfg", "pyproject.toml", "README.md"):
        (shutil.copytree if name == "dael_plugin" else shutil.copy)(os.path.join(ROOT, name), src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheel = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    site = tmp_path / "site"
    (whl,) = (tmp_path / "dist").glob("dael_plugin-*.whl")
    import zipfile

    with zipfile.ZipFile(whl) as z:  # a pure-Python wheel installs by unpacking (pip's --target, without pip's start)
        z.extractall(site)
    assert (site / "dael_plugin" / "tools" / "paper_results.json").is_file()  # package data shipped
    tree = tmp_path / "my_configs"  # a user's own tree, in Dassl's datasets/ + trainers/ split
    (tree / "datasets" / "da").mkdir(parents=True)
    (tree / "trainers" / "da" / "dael").mkdir(parents=True)
    shutil.copy(DS, tree / "datasets" / "da" / "mine.yaml")
    shutil.copy(
        os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
        tree / "trainers" / "da" / "dael" / "mine.yaml",
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env.update(PYTHONPATH=str(site), DAEL_PLUGIN_HIDE_DASSL="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dael_plugin.tools.sweep",
            "--root",
            tiny_root,
            "--dataset-config-file",
            str(tree / "datasets" / "da" / "mine.yaml"),
            "--output-dir",
            str(work / "sweep"),
            "--trainers",
            "DAEL",
            "--targets",
            "blend",
            *FAST,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (log,) = (work / "sweep").rglob("sweep_log.txt")
    first = log.read_text().splitlines()[0]
    assert first.startswith(f"$ {sys.executable} -m dael_plugin.tools.train ") and str(tree) in first
    (record,) = (work / "sweep").rglob("results.json")
    assert json.loads(record.read_text())["accuracy"] >= 0
    where = subprocess.run(
        # where `import dael_plugin` finds the package, without importing it (and torch: 4 s of CPU)
        [sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('dael_plugin').origin)"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's code ran, not the checkout's
    # Without a trainers/ tree beside it, one line says how to give the method config.
    lone = tmp_path / "lone.yaml"
    shutil.copy(DS, lone)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dael_plugin.tools.sweep",
            "--root",
            tiny_root,
            "--dataset-config-file",
            str(lone),
            "--output-dir",
            str(work / "s2"),
            "--trainers",
            "DAEL",
            "--dry-run",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("pass --config TRAINER=FILE")


def test_a_quoted_tilde_is_the_home_folder_for_sweep_and_collect(tmp_path, capsys, monkeypatch):
    """'~/x' quoted reaches the tools unexpanded: it made a folder named '~' in the current one."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    argv = base("data", tmp_path, "--trainers", "DAEL", "--dry-run")
    argv[argv.index("--output-dir") + 1] = "~/sw"
    code, out, err = sweep(argv, capsys)
    assert code == 0, err
    assert str(home / "sw") in out and not (tmp_path / "~").exists()
    from dael_plugin.tools.collect import main as collect

    (home / "empty").mkdir()
    assert collect(["~/empty"]) == 2
    assert "no results.json under" in capsys.readouterr().err  # found the folder, not "is not a folder"


def test_collect_a_wilds_figure(tmp_path, capsys):
    """``--metric wilds:acc_worst_region``: each cell the records' WILDS figure (a fraction) in percent;
    a record without that figure names the ones it has; --select is refused (epoch records lack it)."""
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    for seed, (acc, worst) in enumerate([(70.0, 0.40), (72.0, 0.46)], 1):
        figures = {"acc_avg": acc / 100, "acc_worst_region": worst, "acc_worst_year": 0.5}
        _record(root, "FMoW", "Vanilla", "test", seed, acc, wilds_metrics=figures)
    assert main([root, "--metric", "wilds:acc_worst_region"]) == 0
    out = capsys.readouterr().out
    assert "target test WILDS's acc_worst_region (%)" in out and "| Vanilla | 43.00 ± 4.24 | 43.00 |" in out
    assert os.path.isfile(os.path.join(root, "results_wilds_acc_worst_region.csv"))
    assert main([root, "--metric", "wilds:acc_wg"]) == 2
    err = capsys.readouterr().err
    assert (
        "records no WILDS figure 'acc_wg' (it holds wilds:acc_avg, wilds:acc_worst_region, wilds:acc_worst_year)" in err
    )
    assert main([root, "--select", "last", "--metric", "wilds:acc_avg"]) == 2
    assert "not of each epoch's record" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([root, "--metric", "worst_region"])
    assert "one of accuracy, mean_class_accuracy, macro_f1, or wilds:<figure>" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field,value,said",
    [
        ("target_domains", [1], "target_domains is [1], not a list of domain names"),
        ("dataset", None, "dataset is None, not a name"),
        ("seed", [2], "seed is [2], not a whole number"),
        ("trainer", 5, "trainer is 5, not a name"),
        ("setting", "both", "setting is 'both', not DA or DG"),
        ("mean_class_accuracy", "60", "mean_class_accuracy '60' is not a percentage from 0 to 100"),
        ("wilds_metrics", ["acc_avg"], "wilds_metrics is not a mapping of WILDS's figure names to numbers"),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_is_named_never_a_traceback(tmp_path, capsys, field, value, said):
    """A hand-edited record whose target is a number, with no dataset, or a list for a seed stopped
    collect, --select and plots.py in a TypeError: it is named, its cell says corrupt, the other
    runs make the table."""
    from dael_plugin.tools.collect import main

    root = str(tmp_path)
    for seed in (1, 2):
        d = _record(root, "Set", "DAEL", "t", seed, 50.0)
        open(os.path.join(d, "epochs.jsonl"), "w").write(json.dumps({"epoch": 1, "target_test_accuracy": 50.0}) + "\n")
    path = os.path.join(d, "results.json")
    rec = json.load(open(path))
    json.dump(
        dict(rec, **{field: value}) if value is not None else {k: v for k, v in rec.items() if k != field},
        open(path, "w"),
    )
    for argv, cell in (
        ([], "| DAEL | 50.00 ± 0.00 [1 not done] |"),
        (["--select", "last"], "| DAEL | 50.00 (n=1, 1 left out) |"),
    ):
        assert main([root, *argv]) == 0, argv
        out, err = capsys.readouterr()
        assert f"warning: skipping {path}: {said} (an edited" in err and "Traceback" not in err
        assert cell in out, out
