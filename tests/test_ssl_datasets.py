"""Dassl's semi-supervised datasets (CIFAR10, CIFAR100, SVHN, STL10) read without Dassl
(dael_plugin/data/ssl_formats.py): Dassl's items, its seeded labeled subsample, STL-10's fold, and
the runs they make on both engines."""

from __future__ import annotations

import json
import os
import random
import re

import dassl_layouts as layouts
import pytest

from dael_plugin.data.folders import apply_official_split, load_splits
from dael_plugin.errors import DAELConfigError

SPLIT = (["labeled"], ["unlabeled"])
DEFAULTS = {"NUM_LABELED": -1, "VAL_PERCENT": 0.1, "ALL_AS_UNLABELED": False, "STL10_FOLD": -1}
CASES = {  # name: the DATASET keys of a run (beside Dassl's defaults)
    "CIFAR10": {"NUM_LABELED": 3, "VAL_PERCENT": 0.0},
    "CIFAR100": {"NUM_LABELED": 3, "VAL_PERCENT": 0.5, "ALL_AS_UNLABELED": True},
    "SVHN": {"NUM_LABELED": 6, "VAL_PERCENT": 0.34},
    "STL10": {"STL10_FOLD": 0},
}


def _options(extra):
    return {**DEFAULTS, "STL10_FOLD_AS_WRITTEN": False, **extra}


def _load(name, root, seed=5, **extra):
    return load_splits(name, root, *SPLIT, seed=seed, options=_options({**CASES[name], **extra}))


def _tuples(items):
    return None if not items else [(i.impath, i.label, i.domain, i.classname) for i in items]


@pytest.mark.dassl
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_reader_gives_dassls_items(name, layouts_root):
    """Paths, labels, domains and order, split for split, as Dassl's reader gives them on the same
    files after ``set_random_seed(5)`` (CIFAR's and SVHN's shuffle draws from Python's RNG)."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    cfg = get_cfg_default()
    cfg.DATASET.ROOT = layouts_root
    cfg.DATASET.update(CASES[name])
    random.seed(5)  # as Dassl's set_random_seed(SEED) leaves Python's RNG before the dataset is read
    ref = DATASET_REGISTRY.get(name)(cfg)
    ours = _load(name, layouts_root)
    for split in ("train_x", "train_u", "val", "test"):
        got = _tuples(ours[split])
        got = got and [(p, label, d, "") for p, label, d, _ in got]  # Dassl names every class ""
        assert got == _tuples(getattr(ref, split)), (name, split)
    assert ours["train_x"] and len(ours["classnames"]) == ref.num_classes and all(ours["classnames"])


def test_cifar_and_svhn_split_as_dassl_describes(layouts_root):
    """Per class, in the folder's listing order: the first floor(n * VAL_PERCENT) are val, the rest
    are shuffled from the seed and the first NUM_LABELED / classes of them are labeled. The labeled
    draw changes with the seed, the val images do not; every item is domain 0; class names are the
    folders (Dassl leaves them empty)."""
    folder = os.path.join(layouts_root, "svhn", "train")
    s = _load("SVHN", layouts_root)  # 6 images a class, 34% val: 2 val, 2 labeled, 2 unlabeled
    for label, cname in enumerate(["000", "001", "002"]):
        listing = [os.path.join(folder, cname, f) for f in os.listdir(os.path.join(folder, cname))]
        mine = {k: [i.impath for i in s[k] if i.label == label] for k in ("train_x", "train_u", "val")}
        assert mine["val"] == listing[:2]  # the listing's first, not a draw
        assert len(mine["train_x"]) == 2 and sorted(mine["train_x"] + mine["train_u"]) == sorted(listing[2:])
    assert s["classnames"] == ["000", "001", "002"] and {i.domain for k in s if k != "classnames" for i in s[k]} == {0}
    draws = {tuple(i.impath for i in _load("SVHN", layouts_root, seed=seed)["train_x"]) for seed in range(6)}
    assert len(draws) > 1  # the labeled subsample is drawn from the seed
    assert _load("SVHN", layouts_root, seed=3)["val"] == s["val"]
    everything = _load("SVHN", layouts_root, ALL_AS_UNLABELED=True)
    assert everything["train_u"] == s["train_u"] + s["train_x"]  # Dassl's order: unlabeled, then labeled


def test_cifar_keys_and_folders_the_set_cannot_honour_are_one_line(layouts_root, tmp_path):
    """NUM_LABELED left at Dassl's default -1 (Dassl: a bare AssertionError), more labels than a
    class holds (Dassl labels fewer without a word), a VAL_PERCENT of 1, a class folder missing
    from test/ (Dassl numbers the test folders on their own: every later label shifts)."""
    with pytest.raises(DAELConfigError, match=r"DATASET.NUM_LABELED -1: .*Dassl's configs: CIFAR10 4000"):
        _load("CIFAR10", layouts_root, NUM_LABELED=-1)
    with pytest.raises(DAELConfigError, match=r"svhn/train/000 holds 4 training images \(after 2 for val\); .* 5 of"):
        _load("SVHN", layouts_root, NUM_LABELED=15)
    with pytest.raises(DAELConfigError, match=r"DATASET.VAL_PERCENT 1.0: "):
        _load("SVHN", layouts_root, VAL_PERCENT=1.0)
    os.symlink(os.path.join(layouts_root, "svhn", "train"), tmp_path / "train")
    os.makedirs(tmp_path / "svhn" / "test" / "000")
    os.symlink(tmp_path / "train", tmp_path / "svhn" / "train")
    with pytest.raises(DAELConfigError, match="class folders differ .* missing \\['001', '002'\\]"):
        _load("SVHN", str(tmp_path))


def test_stl10_reads_the_fold_of_the_sorted_training_images(layouts_root):
    """Fold 0 ("7 2 4 0 5 1") of the sorted train/ listing, in the fold's order; labels from the
    file names; the unlabeled images are labeled -1 (``none``); STL-10's class names."""
    s = _load("STL10", layouts_root)
    assert [os.path.basename(i.impath) for i in s["train_x"]] == [f"{k:06d}_{k % 3}.jpg" for k in (7, 2, 4, 0, 5, 1)]
    assert [i.label for i in s["train_x"]] == [1, 2, 1, 0, 2, 1]
    assert {i.label for i in s["train_u"]} == {-1} and len(s["train_u"]) == 5 and len(s["test"]) == 4
    assert s["classnames"] == ["airplane", "bird", "car"] and s["val"] is None
    assert [i.classname for i in s["test"]] == [["airplane", "bird", "car"][i.label] for i in s["test"]]


def _many_training_images(root, n=300):
    """An STL-10 folder of ``n`` training images (empty files: the reader reads names) and one fold
    naming image 260, which Dassl's uint8 parse reads as image 4."""
    for split, count in (("train", n), ("test", 2), ("unlabeled", 2)):
        os.makedirs(os.path.join(root, "stl10", split))
        for i in range(count):
            label = "none" if split == "unlabeled" else str(i % 10)
            open(os.path.join(root, "stl10", split, f"{i:06d}_{label}.jpg"), "w").close()
    layouts._write_lines(os.path.join(root, "stl10", "stl10_binary", "fold_indices.txt"), ["3 260 9"])


def test_stl10_fold_past_255_is_refused_or_read_as_written(tmp_path, layouts_root):
    """Dassl parses the fold as np.uint8 (260 reads as 4): where that differs from the file, one
    line; STL10_FOLD_AS_WRITTEN reads image 260. A fold naming an image past train/ is one line."""
    root = str(tmp_path)
    _many_training_images(root)
    wrapped = r"np.uint8, .*\(260 reads as 4\): it would train on 3 distinct images among the first 256 for the 3 "
    with pytest.raises(DAELConfigError, match=wrapped + ".* set DATASET.STL10_FOLD_AS_WRITTEN True"):
        _load("STL10", root)
    s = _load("STL10", root, STL10_FOLD_AS_WRITTEN=True)
    assert [os.path.basename(i.impath) for i in s["train_x"]] == ["000003_3.jpg", "000260_0.jpg", "000009_9.jpg"]
    with pytest.raises(DAELConfigError, match=r"fold 1 names image 260, and train/ holds 9"):
        _load("STL10", layouts_root, STL10_FOLD=1, STL10_FOLD_AS_WRITTEN=True)
    for fold in (-1, 5):  # Dassl asserts 0 <= fold <= 4
        with pytest.raises(DAELConfigError, match=rf"DATASET.STL10_FOLD {fold}: STL-10's labeled folds are 0 to 4"):
            _load("STL10", layouts_root, STL10_FOLD=fold)


@pytest.mark.dassl
def test_dassls_registry_reads_stl10_as_written_through_the_plugin(tmp_path):
    """On the Dassl engine STL10_FOLD_AS_WRITTEN gives the plugin's reading; without it, Dassl's own."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    import dael_plugin  # noqa: F401  (wraps Dassl's readers)
    from dael_plugin.config import add_dael_config

    _many_training_images(str(tmp_path))
    cfg = get_cfg_default()
    add_dael_config(cfg)
    cfg.DATASET.NAME, cfg.DATASET.ROOT, cfg.DATASET.STL10_FOLD = "STL10", str(tmp_path), 0
    cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS = SPLIT
    dassls = DATASET_REGISTRY.get("STL10")(cfg)
    assert [os.path.basename(d.impath) for d in dassls.train_x] == ["000003_3.jpg", "000004_4.jpg", "000009_9.jpg"]
    cfg.DATASET.STL10_FOLD_AS_WRITTEN = True
    ours = DATASET_REGISTRY.get("STL10")(cfg)
    assert [os.path.basename(d.impath) for d in ours.train_x] == ["000003_3.jpg", "000260_0.jpg", "000009_9.jpg"]


def test_the_runs_domains_name_the_two_parts():
    """Left out, the domains become labeled -> unlabeled (Dassl's configs name none); others are one line."""
    from yacs.config import CfgNode as CN

    ds = CN({"NAME": "CIFAR10", "SOURCE_DOMAINS": [], "TARGET_DOMAINS": []})
    apply_official_split(ds)
    assert (ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS) == SPLIT
    ds.SOURCE_DOMAINS = ["unlabeled"]
    with pytest.raises(DAELConfigError, match=r"CIFAR10 brings its own split, source \['labeled'\] -> target"):
        apply_official_split(ds)


def test_an_stl10_run_records_no_oracle_figure_from_unlabeled_images(layouts_root, tmp_path):
    """STL-10's unlabeled images are labeled -1: the oracle's target_val_accuracy is None (never 0 %,
    a figure that looks measured), and the test split is scored on its labels."""
    from conftest import ROOT, run_here

    out = tmp_path / "run"
    args = ["--engine", "builtin", "--trainer", "FixMatch", "--root", layouts_root, "--output-dir", str(out)]
    args += ["--dataset-config-file", os.path.join(ROOT, "configs", "datasets", "ssl", "stl10.yaml")]
    args += ["--config-file", os.path.join(ROOT, "configs", "trainers", "ssl", "fix_match", "stl10.yaml")]
    args += ["--seed", "1", "OPTIM.MAX_EPOCH", "1", "INPUT.SIZE", "(32, 32)", "MODEL.BACKBONE.PRETRAINED", "False"]
    args += ["DATALOADER.TRAIN_X.BATCH_SIZE", "2", "DATALOADER.TRAIN_U.BATCH_SIZE", "2", "DATALOADER.NUM_WORKERS", "0"]
    res = run_here(args)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads((out / "epochs.jsonl").read_text().splitlines()[-1])
    assert record["target_val_accuracy"] is None and record["target_val_size"] == 0
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"] == "STL10" and results["target_domains"] == ["unlabeled"], results


@pytest.mark.parametrize("workers", [0, 1])
def test_images_smaller_than_the_crop_are_one_line(layouts_root, tmp_path, workers):
    """STL-10's config crops 96x96 without resizing (Dassl's random_crop): the fixture's 32x32
    images cannot take it. One line naming the image and the keys, also from a loader worker (whose
    error torch hands over with the worker's traceback in its message); Dassl: a traceback."""
    from conftest import ROOT, run_here

    args = ["--engine", "builtin", "--trainer", "FixMatch", "--root", layouts_root, "--output-dir", str(tmp_path)]
    args += ["--dataset-config-file", os.path.join(ROOT, "configs", "datasets", "ssl", "stl10.yaml")]
    args += ["--config-file", os.path.join(ROOT, "configs", "trainers", "ssl", "fix_match", "stl10.yaml")]
    args += ["OPTIM.MAX_EPOCH", "1", "MODEL.BACKBONE.PRETRAINED", "False", "DATALOADER.NUM_WORKERS", str(workers)]
    res = run_here(args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert re.match(
        r"error: .*stl10/train/\d+_\d\.jpg \(32x32\): the transforms cannot take it \(Required crop", lines[0]
    )
    assert "set INPUT.SIZE to the images' size" in lines[0] and not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
@pytest.mark.parametrize("key, value", [("NUM_SHOTS", "5"), ("NUM_LABELED", "4000"), ("STL10_FOLD_AS_WRITTEN", "True")])
def test_a_readers_key_on_a_dataset_that_does_not_read_it_is_one_line(engine, key, value, tmp_path):
    """Dassl reads NUM_SHOTS for its WILDS sets alone and NUM_LABELED for CIFAR and SVHN: on PACS it
    would train on every image without a word. One line naming the readers, before any folder."""
    from conftest import ROOT, run_here

    args = ["--engine", engine, "--trainer", "DAELDG", "--root", str(tmp_path), "--output-dir", str(tmp_path / "o")]
    args += ["--dataset-config-file", os.path.join(ROOT, "configs", "datasets", "dg", "pacs.yaml")]
    args += ["--config-file", os.path.join(ROOT, "configs", "trainers", "dg", "daeldg", "pacs.yaml")]
    args += ["--source-domains", "photo", "cartoon", "--target-domains", "sketch", "--", f"DATASET.{key}", value]
    res = run_here(args)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"DATASET.{key} " in res.stderr and "PACS's reader does not read it" in res.stderr
    assert ("Camelyon17, FMoW, IWildCam" in res.stderr) == (key == "NUM_SHOTS")
    assert not (tmp_path / "o").exists()


def test_a_sweep_finds_the_ssl_trainer_configs_and_names_the_two_parts(tmp_path):
    """sweep.py on configs/datasets/ssl/: the run's domains labeled -> unlabeled, FixMatch's config
    from configs/trainers/ssl/ (the folder the dataset config is in)."""
    from conftest import ROOT
    from dael_plugin.tools.sweep import build_parser, plan

    ds = os.path.join(ROOT, "configs", "datasets", "ssl", "cifar10.yaml")
    args = build_parser().parse_args(["--root", str(tmp_path), "--output-dir", str(tmp_path / "s")] + [
        "--dataset-config-file", ds, "--trainers", "FixMatch", "--seeds", "1"
    ])  # fmt: skip
    args.opts = []
    (run,) = plan(args)
    assert run.sources == ("labeled",) and run.target == "unlabeled"
    assert run.config_file == os.path.join(ROOT, "configs", "trainers", "ssl", "fix_match", "cifar10.yaml")
