"""Data fingerprints (dael_plugin/data/fingerprint.py): in results.json on both engines, compared
by collect, with ``--check-data``'s counts and pixel hashes. The resume side is in
test_resume_data.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from dael_plugin.data.fingerprint import data_fingerprint, fingerprint_changes, one_digest
from dael_plugin.data.items import Item
from test_hardening import args_for, cli


def _sha(lines):
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_the_fingerprint_by_hand():
    """Paths relative to the root, label after a tab, sorted, repeats kept; domains by the split's
    own list (sources for train_x, targets for test); seeded domains marked."""
    root = "/data"
    splits = {
        "train_x": [
            Item("/data/d/b/2.png", 1, 1, "b"),
            Item("/data/d/a/1.png", 0, 0, "a"),
            Item("/data/d/b/2.png", 1, 1, "b"),
        ],
        "train_u": None,
        "test": [Item("/elsewhere/x.png", 0, 0, "a")],
    }
    fp = data_fingerprint(splits, ["s0", "s1"], ["t"], root, seeded=("s1",))
    assert fp == {
        "train_x": {
            "s0": {"images": 1, "sha256": _sha(["d/a/1.png\t0"])},
            "s1": {"images": 2, "sha256": _sha(["d/b/2.png\t1", "d/b/2.png\t1"]), "seeded": True},
        },
        "test": {"t": {"images": 1, "sha256": _sha(["/elsewhere/x.png\t0"])}},  # outside the root: absolute
    }
    moved = data_fingerprint(
        {"train_x": [Item("/mnt/d/a/1.png", 0, 0, "a"), Item("/mnt/d/b/2.png", 1, 1, "b")] * 1},
        ["s0", "s1"],
        ["t"],
        "/mnt",
    )
    assert moved["train_x"]["s0"] == fp["train_x"]["s0"]  # another root, the same copy
    relabelled = data_fingerprint({"train_x": [Item("/data/d/a/1.png", 3, 0, "a")]}, ["s0", "s1"], ["t"], root)
    assert relabelled["train_x"]["s0"]["sha256"] != fp["train_x"]["s0"]["sha256"]
    other_draw = json.loads(json.dumps(fp))
    other_draw["train_x"]["s1"]["sha256"] = "0" * 64
    assert one_digest(other_draw) != one_digest(fp) and one_digest(other_draw, True) == one_digest(fp, True)
    other_draw["train_x"]["s0"]["sha256"] = "0" * 64  # not seeded: differs either way
    assert one_digest(other_draw, True) != one_digest(fp, True)
    assert (
        fingerprint_changes(fp, relabelled)
        == [
            "test/t: read by the checkpoint's run, not now",
            f"train_x/s0: 1 images (sha256 {relabelled['train_x']['s0']['sha256'][:12]}) where the checkpoint's "
            f"run read 1 (sha256 {fp['train_x']['s0']['sha256'][:12]})",
            f"train_x/s1: 0 images (sha256 {_sha([])[:12]}) where the checkpoint's run read 2 "  # every domain listed
            f"(sha256 {fp['train_x']['s1']['sha256'][:12]})",
        ]
    )
    assert fingerprint_changes(relabelled, fp)[0] == "test/t: read now, not by the checkpoint's run"


def _run(root, out, capsys, flags=(), engine="builtin"):
    argv = args_for(root, out, flags=flags)
    argv[argv.index("--engine") + 1] = engine
    code, stdout, err = cli(argv, capsys)
    assert code == 0, err
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), stdout


def _expected(root, domain, split="train"):
    folder = os.path.join(root, "embedded_digits", domain, split)
    lines = sorted(
        f"embedded_digits/{domain}/{split}/{c}/{f}\t{int(c)}"
        for c in os.listdir(folder)
        for f in os.listdir(os.path.join(folder, c))
        if f.endswith(".png")
    )
    return {"images": len(lines), "sha256": _sha(lines)}


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_results_carry_the_fingerprint_and_check_data_its_counts_and_pixels(engine, tiny_root, tmp_path, capsys):
    """The record's fingerprint is the hand-made one of the files on disk; the same on both
    engines. ``--check-data`` prints images per class, split and domain; ``--hash-pixels`` hashes
    the bytes: an image rewritten in place keeps the fingerprint and changes the pixel hash."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root)
    res, out = _run(root, tmp_path / "a", capsys, ["--check-data", "--hash-pixels"], engine)
    fp = res["data"]
    assert fp["train_x"]["hand"] == _expected(root, "hand") and fp["train_x"]["font"] == _expected(root, "font")
    assert fp["train_u"]["street"] == _expected(root, "street") and fp["test"]["street"] == _expected(
        root, "street", "test"
    )
    assert res["data_digest"] == one_digest(fp)
    table = [ln.strip() for ln in out.splitlines() if ln.startswith("  ")]
    head = table[0].split()
    assert head == ["class", "train_x/hand", "train_x/blend", "train_x/font", "train_u/street", "test/street"], out
    assert table[1].split() == ["0", "6", "6", "6", "6", "6"] and table[-1].split() == ["all"] + ["60"] * 5
    pixels = res["data_pixels_sha256"]
    assert set(pixels) == {"train_x", "train_u", "test"} and set(pixels["train_x"]) == {"hand", "blend", "font"}

    from PIL import Image

    img = os.path.join(root, "embedded_digits", "hand", "train", "3")
    first = os.path.join(img, sorted(os.listdir(img))[0])
    Image.new("RGB", (32, 32), (255, 0, 0)).save(first)  # the same name, other pixels
    res2, _ = _run(root, tmp_path / "b", capsys, ["--check-data", "--hash-pixels"], engine)
    assert res2["data"] == fp
    assert res2["data_pixels_sha256"]["train_x"]["hand"] != pixels["train_x"]["hand"]
    assert res2["data_pixels_sha256"]["train_x"]["font"] == pixels["train_x"]["font"]


def test_hash_pixels_needs_check_data(tiny_root, tmp_path, capsys):
    from test_hardening import one_error_line

    code, _, err = cli(args_for(tiny_root, tmp_path / "x", flags=["--hash-pixels"]), capsys)
    assert code == 2 and "--hash-pixels goes with --check-data" in one_error_line(err)


def _record(tmp_path, folder, seed, data, trainer="DAEL"):
    d = tmp_path / folder
    d.mkdir(parents=True)
    rec = {
        "dataset": "Digit5",
        "trainer": trainer,
        "target_domains": ["mnist"],
        "seed": seed,
        "accuracy": 90.0,
        "engine": "builtin",
        "provenance": {"config": f"SEED: {seed}\n"},
        "data": data,
    }
    (d / "results.json").write_text(json.dumps(rec))
    return str(d / "results.json")


def _fp(svhn="a", usps="b", n=25000):
    return {
        "train_x": {
            "svhn": {"images": n, "sha256": svhn * 64, "seeded": True},
            "usps": {"images": 21, "sha256": usps * 64},
        }
    }


def test_collect_keeps_runs_of_other_data_out_of_one_cell(tmp_path, capsys):
    """Seeds of one cell may differ in a seeded domain's draw (Digit-5), not elsewhere; runs of one
    seed and target read the same images in every row. Otherwise one line names both records."""
    from dael_plugin.tools.collect import main as collect

    _record(tmp_path, "Digit5/DAEL/mnist/seed1", 1, _fp("a"))
    _record(tmp_path, "Digit5/DAEL/mnist/seed2", 2, _fp("c"))  # another draw of svhn: fine
    _record(tmp_path, "Digit5/SourceOnly/mnist/seed1", 1, _fp("a"), "SourceOnly")
    assert collect([str(tmp_path)]) == 0
    capsys.readouterr()
    bad = _record(tmp_path, "Digit5/SourceOnly/mnist/seed2", 2, _fp("d"), "SourceOnly")  # seed 2 read other svhn
    assert collect([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one column, mnist seed 2" in err[0] and bad in err[0], err
    assert "Digit5/DAEL/mnist/seed2/results.json" in err[0]
    os.remove(bad)
    bad = _record(tmp_path, "Digit5/SourceOnly/mnist/seed3", 3, _fp("e", usps="f"), "SourceOnly")  # other usps
    assert collect([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "one cell, SourceOnly -> mnist" in err and bad in err
    os.remove(bad)
    edited = _record(tmp_path, "Digit5/SourceOnly/mnist/seed4", 4, {"train_x": {"svhn": "edited"}}, "SourceOnly")
    assert collect([str(tmp_path)]) == 0  # a malformed fingerprint: the record is corrupt, said, never averaged
    cap = capsys.readouterr()
    assert f"skipping {edited}: its data fingerprint is not" in cap.err and "[1 not done]" in cap.out


def test_runs_of_other_sources_in_one_column_compare_the_domains_both_read(tmp_path, capsys):
    """Seed 1 on sources svhn, usps and on svhn alone, for mnist: other rows (results_reader.domains_read),
    one column, whose fingerprints agree on svhn, the one domain both read; a run on svhn alone that
    read another svhn is one line. (Compared whole, the two rows' fingerprints always differ.)"""
    from dael_plugin.tools.collect import main as collect

    def record(folder, sources, fp):
        path = _record(tmp_path, folder, 1, fp)
        rec = json.loads(open(path).read())
        rec["source_domains"] = sources
        open(path, "w").write(json.dumps(rec))
        return path

    both = _fp("a")
    record("Digit5/DAEL/mnist/seed1", ["svhn", "usps"], both)
    record("Digit5/DAEL/one/mnist/seed1", ["svhn"], {"train_x": {"svhn": both["train_x"]["svhn"]}})
    assert collect([str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| DAEL")]
    assert len(rows) == 2, rows
    bad = record("Digit5/DAEL/two/mnist/seed1", ["svhn"], {"train_x": {"svhn": _fp("c")["train_x"]["svhn"]}})
    assert collect([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "read different images (one column, mnist seed 1" in err and bad in err, err


@pytest.mark.dassl
@pytest.mark.parametrize("name", ["Digit5", "PACS"])
def test_both_engines_fingerprint_the_same_images(name, request):
    """One fingerprint for one copy of the data, whichever engine read it: Dassl's own reader's
    dataset (as the Dassl engine fingerprints it) and the built-in reader's splits. (The trainers'
    plumbing is tested above, through the train script on both engines.)"""
    import random

    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    from dael_plugin.data.fingerprint import dataset_fingerprint, seeded_domains
    from dael_plugin.data.folders import load_splits

    sources, targets = {"Digit5": (["svhn", "usps"], ["mnist"]), "PACS": (["photo", "sketch"], ["cartoon"])}[name]
    root = request.getfixturevalue("digit5_root" if name == "Digit5" else "layouts_root")  # conftest
    cfg = get_cfg_default()
    cfg.DATASET.NAME, cfg.DATASET.ROOT = name, root
    cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS = sources, targets
    random.seed(4)  # as set_random_seed(SEED) leaves it
    theirs = dataset_fingerprint(cfg, DATASET_REGISTRY.get(name)(cfg))
    ours = data_fingerprint(
        load_splits(name, root, sources, targets, seed=4), sources, targets, root, seeded_domains(cfg.DATASET)
    )
    assert ours == theirs
    assert any(v.get("seeded") for doms in ours.values() for v in doms.values()) == (name == "Digit5")


@pytest.mark.parametrize("argv", [["--select", "source_val"], ["--select", "last"], ["--validators"]])
def test_select_and_validators_refuse_runs_of_other_data_as_collect_does(tmp_path, capsys, argv):
    """The probe's bad case: two seeds on one copy of the data and a third on a copy with an image
    less gave a --select mean over the three without a word. Now the same one line as plain collect."""
    from dael_plugin.tools.collect import main as collect

    for seed, fp in ((1, _fp("a")), (2, _fp("a"))):
        _record(tmp_path, f"Digit5/DAEL/mnist/seed{seed}", seed, fp)
    assert collect([str(tmp_path), *argv]) in (0, 2)  # no epochs: --validators says so (2), --select 0
    capsys.readouterr()
    bad = _record(tmp_path, "Digit5/DAEL/mnist/seed3", 3, _fp("a", usps="f", n=24999))
    assert collect([str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "read different images" in err[0] and bad in err[0], err
