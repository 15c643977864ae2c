"""Model selection's inputs: the source validation split, the per-epoch records and the protocols'
best checkpoints (engine/selection.py), on both engines."""

import dataclasses
import functools
import json
import os
from collections import namedtuple

import pytest
import torch
from test_gpu_stand_ins import DS, ROOT, _cfg, _trainer

from dael_plugin.data.holdout import holdout_split
from dael_plugin.engine import selection as S

It = namedtuple("It", "impath label domain")


def _items(n_per=10, domains=3, classes=4):
    return [It(f"/d{d}/c{c}/{i}.png", c, d) for d in range(domains) for c in range(classes) for i in range(n_per)]


def test_holdout_is_stratified_deterministic_and_disjoint():
    items = _items()
    train, val = holdout_split(items, 0.2, seed=3)
    assert len(val) == 3 * 4 * 2 and len(train) == len(items) - len(val)
    assert not {it.impath for it in train} & {it.impath for it in val}
    for d in range(3):
        for c in range(4):
            assert sum(1 for it in val if (it.domain, it.label) == (d, c)) == 2  # every class of every domain
    assert holdout_split(items, 0.2, seed=3) == (train, val)
    assert holdout_split(list(reversed(items)), 0.2, seed=3)[1] == list(reversed(val))  # not the listing order
    assert holdout_split(items, 0.2, seed=4)[1] != val
    # a group of one image keeps it for training; fraction 0 holds nothing out
    one = [It("/a.png", 0, 0)] + _items(5, 1, 1)
    assert It("/a.png", 0, 0) in holdout_split(one, 0.5, 0)[0] or len(holdout_split(one, 0.5, 0)[1]) == 3
    assert holdout_split(items, 0.0, 1) == (items, [])
    with pytest.raises(ValueError):
        holdout_split(items, 1.0, 1)


def _outputs(labels, domains=None, seed=0, k=3, c=4, d=5):
    g = torch.Generator().manual_seed(seed)
    n = len(labels)
    probs = torch.softmax(torch.randn(n, k, c, generator=g) * 3, -1)
    return S.Outputs(
        torch.randn(n, d, generator=g),
        probs,
        torch.tensor(labels),
        torch.tensor(domains if domains is not None else [0] * n),
    )


def test_no_protocol_but_the_oracle_reads_target_labels():
    """Scrambling the target's labels (its train subsample and its test split) changes the oracle's
    and the reported test accuracies, and nothing any other protocol reads."""
    src_val = _outputs([0, 1, 2, 3] * 6, [0, 1, 2] * 8, seed=1)
    src_train = _outputs([0, 1, 2, 3] * 10, [0, 1, 2] * 13 + [0], seed=2)
    target = _outputs([0, 1, 2, 3] * 8, seed=3)
    test = _outputs([3, 2, 1, 0] * 5, seed=4)
    names = ["hand", "street", "font"]

    def record(tgt, tst):
        outs = {"test": tst, "source_val": src_val, "target": tgt, "source_train": src_train}
        return S.epoch_record(4, outs, S.Scoring(names, 4, 0.5, 7))

    base = record(target, test)
    flipped = record(
        S.Outputs(target.feats, target.probs, (target.labels + 1) % 4, target.domains),
        S.Outputs(test.feats, test.probs, (test.labels + 2) % 4, test.domains),
    )
    oracle_only = {"target_val_accuracy", "target_test_accuracy", "target_test_accuracy_per_expert"}
    oracle_only |= {"target_test_mean_class_accuracy", "target_test_macro_f1"}  # (reported, as the accuracy)
    assert {k: v for k, v in base.items() if k not in oracle_only} == {
        k: v for k, v in flipped.items() if k not in oracle_only
    }
    assert base["target_val_accuracy"] != flipped["target_val_accuracy"]
    assert set(base["validators"]) == set(S.VALIDATORS)
    for p in S.SCORED:
        if p != "oracle":
            assert S.protocol_score(base, p) == S.protocol_score(flipped, p), p


def test_records_skip_a_corrupt_line_and_keep_the_earliest_best(tmp_path, capsys):
    rec = S.EpochsFile(str(tmp_path))
    saved = []
    for epoch, acc in [(1, 10.0), (2, 30.0), (3, 30.0), (4, 20.0)]:
        rec.append(
            {"epoch": epoch, "source_val_accuracy": acc}, lambda p, e=epoch: saved.append((e, p)), ["source_val"]
        )
    assert [e for e, _ in saved] == [1, 2]  # a tie keeps the earlier epoch
    assert saved[-1][1].endswith("model-best-source_val.pth.tar")
    with open(rec.path, "a") as f:
        f.write("{not json\n")
    assert [r["epoch"] for r in rec.read()] == [1, 2, 3, 4]
    assert "line 5: not an epoch record" in capsys.readouterr().out
    rec.truncate(2)
    assert [r["epoch"] for r in rec.read()] == [1, 2]


def _build(engine, out, root, epochs, **extra):
    """A trainer of ``engine`` with records every epoch (``extra``: other SELECTION keys)."""
    cfg = _cfg(out, root, engine, epochs=epochs)
    cfg.defrost()
    cfg.SELECTION.EVAL_FREQ = 1
    cfg.SELECTION.TARGET_CAP = 40
    for k, v in extra.items():
        cfg.SELECTION[k] = v
    return _trainer(engine, cfg)


def _train_paths(tr, engine):
    m = getattr(tr, "method", tr)  # the method the Dassl engine hosts, or a Dassl trainer
    if hasattr(m, "splits"):
        return {it.impath for it in m.splits["train_x"]}, {it.impath for it in m.source_val_items}
    return {d.impath for d in tr.dm.dataset.train_x}, {d.impath for d in tr.source_val_items}


def _loaded_paths(loader):
    ds = loader.dataset
    source = getattr(ds, "items", None) or getattr(ds, "data_source", None)
    return {getattr(it, "impath", None) for it in source}


ENGINES = ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)]


@pytest.mark.parametrize("engine", ENGINES)
def test_records_on_each_engine_and_a_source_split_never_trained_on(tmp_path, tiny_root, engine):
    if engine == "dassl":
        pytest.importorskip("dassl")
    build = functools.partial(_build, engine)
    tr = build(tmp_path / "run", tiny_root, 2)
    train, val = _train_paths(tr, engine)
    assert val and not train & val
    assert not _loaded_paths(tr.train_loader_x) & val  # the training loader reads the train part only
    tr.train()
    recs = [json.loads(line) for line in open(tmp_path / "run" / S.EPOCHS)]
    assert [r["epoch"] for r in recs] == [1, 2]
    for r in recs:
        assert set(r["source_val_accuracy_per_domain"]) == {"hand", "street", "font"}
        assert set(r["validators"]) == set(S.VALIDATORS)
        assert r["target_val_size"] == 40 and r["source_val_size"] == len(val)
        assert 0 <= r["target_test_accuracy"] <= 100
    from dael_plugin.engine.checkpoint import RESUME_ONLY

    inodes = {}
    for p in S.SCORED:  # each protocol's best checkpoint holds the epoch its score chose
        scores = [(S.protocol_score(r, p), -r["epoch"]) for r in recs]
        path = tmp_path / "run" / S.best_name(p)
        if p == "val":  # the embedded set has no val of its own (WILDS's OOD val: tests/test_wilds.py)
            assert all(s is None for s, _ in scores) and not path.exists()
            continue
        chosen = -max(scores)[1]
        state = torch.load(path, map_location="cpu", weights_only=True)
        assert state["epoch"] == chosen, p
        assert not set(state) & set(RESUME_ONLY) and state["model"]
        inodes.setdefault(chosen, set()).add(os.stat(path).st_ino)
    # the protocols that chose one epoch share one file (written once, hard links for the others)
    assert all(len(files) == 1 for files in inodes.values()), inodes


@pytest.mark.parametrize("engine", ENGINES)
def test_records_are_exact_on_resume(tmp_path, tiny_root, engine):
    """A run killed after an epoch's record but before its checkpoint redoes that epoch on resume:
    its records are then exactly an uninterrupted run's (failure injected in the checkpoint save)."""
    if engine == "dassl":
        pytest.importorskip("dassl")
    build = functools.partial(_build, engine)
    whole = build(tmp_path / "whole", tiny_root, 3)
    whole.train()
    expected = open(tmp_path / "whole" / S.EPOCHS).read()

    killed = build(tmp_path / "cut", tiny_root, 3)
    calls = {"n": 0}
    hooked = getattr(killed, "method", killed)  # the Dassl engine's trainer hosts the method
    real = hooked.checkpointer.save

    def dies_at_the_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    hooked.checkpointer.save = dies_at_the_second  # the hook's own save (engine/hooks.py)
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    cut = open(tmp_path / "cut" / S.EPOCHS).read()
    assert [json.loads(x)["epoch"] for x in cut.splitlines()] == [1, 2]  # epoch 2's record, no checkpoint
    build(tmp_path / "cut", tiny_root, 3).train()
    assert open(tmp_path / "cut" / S.EPOCHS).read() == expected


def test_ranks_that_drew_different_splits_stop_in_one_line(monkeypatch):
    from dael_plugin.engine import distributed
    from dael_plugin.errors import DAELConfigError

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(0, 2, 0, True))
    monkeypatch.setattr(distributed, "gather_objects", lambda obj: [obj, obj])
    S.same_on_every_rank(["a.png", "b.png"], "splits")  # the same draw: nothing to say
    monkeypatch.setattr(distributed, "gather_objects", lambda obj: [obj, "another"])
    with pytest.raises(DAELConfigError, match="different splits"):
        S.same_on_every_rank(["a.png", "b.png"], "splits")


# Records after kill -9 equal an uninterrupted run's, byte for byte, on both engines: in
# test_hardening.py's test_resume_after_kill_9_is_bitwise_exact_with_persistent_workers.


def _argv(engine, name, out, root, epochs, *extra):
    """train.py's arguments for ``name`` (its embedded-set config) with records every epoch."""
    folder = {"SourceOnly": "source_only"}.get(name, name.lower())
    return (
        ["--engine", engine, "--trainer", name, "--root", root, "--dataset-config-file", DS]
        + ["--config-file", f"{ROOT}/configs/trainers/da/{folder}/embedded_digits.yaml"]
        + ["--source-domains", "hand", "street", "font", "--target-domains", "blend", "--output-dir", str(out)]
        + ["--seed", "1", "OPTIM.MAX_EPOCH", str(epochs), "DATALOADER.NUM_WORKERS", "0"]
        + ["DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8"]
        + ["SELECTION.EVAL_FREQ", "1", "SELECTION.TARGET_CAP", "40", *extra]
    )


def _baseline(name, out, root, epochs, *extra):
    """Dassl's trainer ``name`` as train.py builds it with records on."""
    from dassl.engine import TRAINER_REGISTRY
    from dassl.utils import set_random_seed

    from dael_plugin.dassl_adapter.records import with_records
    from dael_plugin.tools.train import build_parser, setup_cfg

    cfg = setup_cfg(build_parser().parse_args(_argv("dassl", name, out, root, epochs, *extra)), "dassl")
    set_random_seed(1)
    return with_records(TRAINER_REGISTRY.get(name))(cfg)


@pytest.mark.dassl
@pytest.mark.parametrize("name,experts,epochs", [("M3SDA", 3, 2), ("MME", 1, 1), ("SourceOnly", 1, 1)])
def test_dassls_baselines_write_the_same_records_from_their_own_predictions(tmp_path, tiny_root, name, experts, epochs):
    """Dassl's M3SDA, MME and SourceOnly, built as train.py builds them with SELECTION.EVAL_FREQ:
    the held-out source images are out of Dassl's source loader, the records' classifiers average
    to exactly the softmax of Dassl's own ``model_inference`` (M3SDA's is already a probability),
    the last record's test accuracy is Dassl's own test, and the chosen models load back."""
    pytest.importorskip("dassl")
    from dael_plugin.dassl_adapter.records import load_best

    tr = _baseline(name, tmp_path / "run", tiny_root, epochs)
    val = {d.impath for d in tr.source_val_items}
    assert val and not {d.impath for d in tr.dm.dataset.train_x} & val
    assert not _loaded_paths(tr.train_loader_x) & val
    # The data fingerprint is the split's before the held-out part leaves it, as the plugin's
    # trainers take it on both engines: else collect calls one table's runs "different images".
    from dael_plugin.tools.train_outdir import run_fingerprint as _fingerprint

    fp = _fingerprint(tr, tr.cfg)
    assert sum(d["images"] for d in fp["train_x"].values()) == len(tr.dm.dataset.train_x) + len(val)
    x = next(iter(tr.test_loader))["img"]
    tr.set_model_mode("eval")
    with torch.no_grad():
        feats, probs = tr.selection.model.encode(x)
        theirs = tr.model_inference(x)
    assert probs.shape == (len(x), experts, tr.num_classes) and feats.shape[0] == len(x)
    expected = theirs if name == "M3SDA" else torch.softmax(theirs, 1)
    torch.testing.assert_close(probs.mean(1), expected)
    tr.train()
    recs = [json.loads(line) for line in open(tmp_path / "run" / S.EPOCHS)]
    # one classifier (MME, SourceOnly) records no expert signal (a constant); M3SDA's three classifiers do
    signals = set(S.VALIDATORS) - (set(S.EXPERT_SIGNALS) if experts == 1 else set())
    assert [r["epoch"] for r in recs] == list(range(1, epochs + 1)) and set(recs[-1]["validators"]) == signals
    assert recs[-1]["classifiers"] == experts
    assert recs[-1]["source_val_size"] == len(val)
    assert recs[-1]["target_test_accuracy"] == pytest.approx(tr.test(), abs=1e-3)
    assert ("target_test_accuracy_per_expert" in recs[-1]) == (experts > 1)
    chosen = -max((S.protocol_score(r, "source_val"), -r["epoch"]) for r in recs)[1]
    assert load_best(tr, str(tmp_path / "run"), "source_val") == chosen


@pytest.mark.dassl
@pytest.mark.parametrize("name", ["CrossGrad", "DDAIG"])
def test_dassls_dg_baselines_write_records_from_their_label_net(tmp_path, tiny_root, name):
    """Dassl's CrossGrad and DDAIG predict with their label net ``F`` (a SimpleNet): the records read
    exactly its softmax, and the last record's test accuracy is Dassl's own test."""
    pytest.importorskip("dassl")
    from dassl.engine import TRAINER_REGISTRY
    from dassl.utils import set_random_seed

    from dael_plugin.dassl_adapter.records import with_records
    from dael_plugin.tools.train import build_parser, setup_cfg

    folder = {"CrossGrad": "cross_grad"}.get(name, name.lower())
    argv = _argv("dassl", name, tmp_path / "run", tiny_root, 1)
    argv[argv.index(DS)] = f"{ROOT}/configs/datasets/dg/embedded_digits_dg.yaml"
    argv[argv.index("--config-file") + 1] = f"{ROOT}/configs/trainers/dg/{folder}/embedded_digits_dg.yaml"
    cfg = setup_cfg(build_parser().parse_args(argv), "dassl")
    set_random_seed(1)
    tr = with_records(TRAINER_REGISTRY.get(name))(cfg)
    x = next(iter(tr.test_loader))["img"]
    tr.set_model_mode("eval")
    with torch.no_grad():
        feats, probs = tr.selection.model.encode(x)
        theirs = tr.model_inference(x)
    assert probs.shape == (len(x), 1, tr.num_classes) and feats.shape[0] == len(x)
    torch.testing.assert_close(probs.mean(1), torch.softmax(theirs, 1))
    tr.train()
    (rec,) = [json.loads(line) for line in open(tmp_path / "run" / S.EPOCHS)]
    assert rec["source_val_size"] == len(tr.source_val_items) > 0 and rec["epoch"] == 1
    assert rec["target_test_accuracy"] == pytest.approx(tr.test(), abs=1e-3)


@pytest.mark.dassl
def test_a_baseline_killed_between_its_record_and_its_checkpoint_redoes_that_record(tmp_path, tiny_root):
    """M3SDA with Dassl's checkpoint every epoch, stopped in epoch 2's checkpoint save (its record
    written): the rerun resumes from epoch 1 and epochs.jsonl holds each epoch once. (Dassl's own
    checkpoints hold no RNG state, so the redone epochs' numbers need not equal an uninterrupted
    run's: that exactness is the plugin's trainers'.)"""
    pytest.importorskip("dassl")
    tr = _baseline("M3SDA", tmp_path, tiny_root, 3, "TRAIN.CHECKPOINT_FREQ", "1")
    real, calls = tr.save_model, {"n": 0}

    def dies_at_the_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    tr.save_model = dies_at_the_second
    with pytest.raises(KeyboardInterrupt):
        tr.train()
    assert [json.loads(x)["epoch"] for x in open(tmp_path / S.EPOCHS)] == [1, 2]
    again = _baseline("M3SDA", tmp_path, tiny_root, 3, "TRAIN.CHECKPOINT_FREQ", "1")
    again.train()
    assert again.start_epoch == 1
    assert [json.loads(x)["epoch"] for x in open(tmp_path / S.EPOCHS)] == [1, 2, 3]


@pytest.mark.dassl
def test_a_baseline_whose_prediction_the_plugin_does_not_know_is_refused_in_one_line():
    pytest.importorskip("dassl")
    from dassl.engine import TrainerX

    from dael_plugin.dassl_adapter.records import baseline_encoder

    class Odd(TrainerX):
        def model_inference(self, input):
            return input

    assert baseline_encoder(object.__new__(Odd)) is None


@pytest.mark.parametrize(
    "engine,name",
    [
        ("builtin", "DAEL"),
        pytest.param("dassl", "DAEL", marks=pytest.mark.dassl),
        pytest.param("dassl", "M3SDA", marks=pytest.mark.dassl),
    ],
)
def test_eval_only_select_evaluates_the_model_the_protocol_chose(tmp_path, tiny_root, engine, name, monkeypatch):
    """``--eval-only --select im`` loads model-best-im.pth.tar, not the last checkpoint: made to hold
    epoch 1's model (as if IM had chosen epoch 1), it is the one file read, the evaluation gives
    epoch 1's recorded test accuracy, and results_eval.json says so."""
    import shutil

    from conftest import run_here
    from dael_plugin.engine import checkpoint as ckpt

    if engine == "dassl":
        pytest.importorskip("dassl")
    run = tmp_path / "run"
    argv = _argv(engine, name, run, tiny_root, 2)
    first = tmp_path / "epoch1.pth.tar"
    if name == "DAEL":
        tr = _trainer(engine, _cfg_from(argv, engine))
    else:
        tr = _baseline(name, run, tiny_root, 2)
    saver = getattr(tr, "method", tr)  # the method the Dassl engine hosts, or a Dassl trainer
    real = saver._save_best

    def keep_epoch_1(path):
        real(path)
        if not first.exists():
            shutil.copy(path, first)

    saver._save_best = keep_epoch_1
    saver.selection.model = dataclasses.replace(saver.selection.model, save_best=keep_epoch_1)
    tr.train()
    recs = [json.loads(line) for line in open(run / S.EPOCHS)]
    assert torch.load(first, weights_only=True)["epoch"] == 1
    shutil.copy(first, run / S.best_name("im"))
    # the records made to agree (IM's best at epoch 1): the kept file must be the records' choice
    recs[0]["validators"]["im"] = max(r["validators"]["im"] for r in recs) + 1.0
    (run / S.EPOCHS).write_text("".join(json.dumps(r) + "\n" for r in recs))
    loaded, load = [], ckpt.load_checkpoint
    monkeypatch.setattr(ckpt, "load_checkpoint", lambda path, *a, **k: loaded.append(str(path)) or load(path, *a, **k))
    ev = tmp_path / "ev"
    evaluate = ["--eval-only", "--model-dir", str(run), "--select", "im"] + _argv(engine, name, ev, tiny_root, 2)
    out = run_here(evaluate)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.load(open(ev / "results_eval.json"))
    assert result["selected_by"] == {"protocol": "im", "epoch": 1}
    assert {os.path.basename(p) for p in loaded} == {S.best_name("im")}  # checked, then loaded
    assert result["accuracy"] == pytest.approx(recs[0]["target_test_accuracy"], abs=1e-3)


def test_eval_only_select_refuses_a_model_its_run_did_not_choose(tmp_path, tiny_root, capsys):
    """The probe's weak cases: a model-best file left by a run stopped while keeping epoch 1's
    choice (no epochs.jsonl), one copied in from another run, one evaluated under another seed, and
    damaged ones (truncated, a text file, a FIFO): each one line that says what is wrong, no
    evaluation. The run's own file passes."""
    from test_hardening import cli, one_error_line

    run = tmp_path / "run"
    assert cli(_argv("builtin", "DAEL", run, tiny_root, 2), capsys)[0] == 0
    best, records = run / S.best_name("im"), run / S.EPOCHS
    kept, recs = best.read_bytes(), records.read_text()
    chosen = torch.load(best, weights_only=True)["epoch"]
    n = iter(range(100))

    def evaluate(seed="1"):
        out = tmp_path / f"ev{next(n)}"
        argv = ["--eval-only", "--model-dir", str(run), "--select", "im"] + _argv("builtin", "DAEL", out, tiny_root, 2)
        argv[argv.index("--seed") + 1] = seed
        code, _, err = cli(argv, capsys)
        return code, err

    assert evaluate()[0] == 0
    cases = []
    other = [json.loads(line) for line in recs.splitlines()]
    for r in other:  # records that choose the other epoch: a file from another run or an unfinished epoch
        r["validators"]["im"] = 1.0 if r["epoch"] != chosen else 0.0
    cases.append(
        (
            "another choice",
            lambda: records.write_text("".join(json.dumps(r) + "\n" for r in other)),
            f"holds epoch {chosen}, but the run's records choose epoch {3 - chosen} under im",
        )
    )
    cases.append(("no records (stopped)", lambda: records.unlink(), "has no im score for any epoch"))
    cases.append(("truncated", lambda: best.write_bytes(kept[: len(kept) // 2]), "is truncated or corrupt"))
    cases.append(("a text file", lambda: best.write_text("hello\n"), "is not a PyTorch checkpoint (a text file)"))
    cases.append(("a FIFO", lambda: (best.unlink(), os.mkfifo(best)), "is not a regular file"))
    for case, spoil, said in cases:
        spoil()
        code, err = evaluate()
        line = one_error_line(err)
        assert code == 2 and said in line, (case, line)
        assert "start this run fresh" not in line  # a resume's advice, not an evaluation's
        if best.exists() and not best.is_file():
            best.unlink()
        best.write_bytes(kept)
        records.write_text(recs)
    code, err = evaluate(seed="3")
    assert code == 2 and "holds a run of seed 1; this evaluation is --seed 3" in one_error_line(err)
    # No --seed (-1, Dassl's default): the evaluation takes the seed of the run it evaluates, where it
    # once drew a random one and was refused here.
    argv = ["--eval-only", "--model-dir", str(run), "--select", "im"] + _argv(
        "builtin", "DAEL", tmp_path / "ev_", tiny_root, 2
    )
    argv[argv.index("--seed") + 1] = "-1"
    code, out, err = cli(argv, capsys)
    assert code == 0 and f"SEED -1: the seed 1 of the run evaluated, from {run / 'checkpoint.pth.tar'}" in out, err
    assert json.loads((tmp_path / "ev_" / "results_eval.json").read_text())["seed"] == 1


def _cfg_from(argv, engine):
    from dael_plugin.tools.train import build_parser, setup_cfg

    return setup_cfg(build_parser().parse_args(argv), engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_auto_records_leave_the_papers_training_unchanged(tmp_path, tiny_root, engine):
    """SELECTION.EVAL_FREQ -1 (the default) on a small set: records every epoch, no source image held
    out, and the trained weights bit for bit those of a run without records (the evaluation draws
    nothing from the training streams)."""
    if engine == "dassl":
        pytest.importorskip("dassl")
    runs = {}
    for freq in (-1, 0):
        cfg = _cfg(tmp_path / str(freq), tiny_root, engine, epochs=1)
        cfg.defrost()
        cfg.SELECTION.EVAL_FREQ = freq
        tr = _trainer(engine, cfg)
        tr.train()
        modules = tr.modules if engine == "builtin" else torch.nn.ModuleDict(tr._models)
        runs[freq] = (tr, {k: v.clone() for k, v in modules.state_dict().items()})
    auto, plain = (getattr(runs[f][0], "method", runs[f][0]) for f in (-1, 0))
    assert auto.eval_freq == 1 and auto.source_val_items == [] and auto.source_val_info["auto"] is True
    assert plain.eval_freq == 0 and plain.source_val_info is None
    assert [json.loads(x)["epoch"] for x in open(tmp_path / "-1" / S.EPOCHS)] == [1]
    assert not (tmp_path / "0" / S.EPOCHS).exists()
    assert len(_train_paths(auto, engine)[0]) == len(_train_paths(plain, engine)[0])
    for k, v in runs[0][1].items():
        assert torch.equal(runs[-1][1][k], v), k


def test_auto_resolves_by_the_size_of_the_sources():
    from yacs.config import CfgNode as CN

    def resolve(freq, frac, n):
        return S.resolve_selection(CN({"EVAL_FREQ": freq, "HOLDOUT_FRACTION": frac}), n)

    assert resolve(-1, -1.0, 2_880) == (1, 0.0, True)  # the embedded set: every epoch, nothing held out
    assert resolve(-1, -1.0, S.AUTO_MAX_SOURCE_IMAGES) == (1, 0.0, True)
    assert resolve(-1, -1.0, S.AUTO_MAX_SOURCE_IMAGES + 1) == (0, 0.0, True)  # Digit-5's 100,000: none
    assert resolve(1, -1.0, 100_000) == (1, 0.2, False)  # asked for: DomainBed's 20% held out
    assert resolve(2, 0.1, 10) == (2, 0.1, False)
    assert resolve(-1, 0.3, 10) == (1, 0.3, True)  # a fraction set by hand holds under auto too
    assert resolve(0, -1.0, 10) == (0, 0.2, False)
    assert S.resolve_selection(None, 10) == (0, 0.2, False)  # Dassl's tools/train.py: no SELECTION node


def test_one_classifier_records_no_expert_signals():
    """``agreement`` and ``mask_rate`` are DAEL's own signals over its experts. One classifier
    (SourceOnly, MME) would give a constant 1 for agreement, and a protocol would then "choose" by
    its tie rule while the ranking pooled the constant with DAEL's checkpoints: they are not written."""
    target = _outputs([0, 1, 2, 3] * 8, seed=3, k=1)
    one = S.validator_scores(target, 4, 0.95, 1, names=("entropy", "agreement", "mask_rate"))
    assert set(one) == {"entropy"}
    experts = S.validator_scores(_outputs([0, 1, 2, 3] * 8, seed=3, k=3), 4, 0.95, 1, names=("agreement", "mask_rate"))
    assert set(experts) == {"agreement", "mask_rate"} and 0 < experts["agreement"] <= 1
    # An older record of one classifier still carries the constant: the protocols read none of it.
    old = {"epoch": 1, "validators": {"agreement": 1.0, "mask_rate": 0.5, "im": 0.3}}
    assert S.protocol_score(old, "agreement") is None and S.protocol_score(old, "mask_rate") is None
    assert S.protocol_score(old, "im") == 0.3
    several = dict(old, target_test_accuracy_per_expert={"a": 50.0, "b": 60.0})
    assert S.protocol_score(several, "agreement") == 1.0
    assert S.protocol_score(dict(several, classifiers=1), "agreement") is None
