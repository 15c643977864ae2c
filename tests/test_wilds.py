"""Dassl's WILDS datasets (Camelyon17, FMoW, IWildCam) on both engines: Dassl's items, the split's
parts as the run's domains, the OOD val kept out of source validation, one line for what cannot run."""

from __future__ import annotations

import json
import os
import shutil

import dassl_layouts as layouts
import pytest
import torch

from dael_plugin.data.folders import load_splits
from dael_plugin.errors import DAELConfigError

pytest.importorskip("wilds", reason="the WILDS readers read the wilds package's metadata: pip install wilds")

WILDS = ("Camelyon17", "FMoW", "IWildCam")


@pytest.fixture(scope="module")
def wilds_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("wilds"))
    layouts.wilds(root)
    return root


def _rel(root, items):
    return [(os.path.relpath(i.impath, root), i.label, i.domain, i.classname) for i in items]


@pytest.mark.dassl
@pytest.mark.parametrize("name", WILDS)
def test_each_wilds_reader_gives_dassls_items(name, wilds_root, tmp_path):
    """Paths, labels, domain numbers, class names and their order, split for split, and the number of
    classes, as Dassl's own WILDSBase reads them from the same release."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    root = shutil.copytree(wilds_root, tmp_path / "r")  # Dassl writes its pickle into the data folder
    cfg = get_cfg_default()
    cfg.DATASET.ROOT = str(root)
    ref = DATASET_REGISTRY.get(name)(cfg)
    ours = load_splits(name, str(root), ["train"], ["test"])
    for split in ("train_x", "val", "test"):
        want = [(d.impath, d.label, d.domain, d.classname) for d in getattr(ref, split)]
        assert [tuple(i) for i in ours[split]] == want, (name, split)
    assert ours["train_u"] is None and ref.train_u is None
    assert len(ours["classnames"]) == ref.num_classes
    assert all(ours["classnames"][k] == c for k, c in ref.lab2cname.items())
    assert len({i.domain for i in ours["train_x"]}) > 1  # many metadata domains in the one named source


@pytest.mark.dassl
@pytest.mark.parametrize("name", WILDS)
def test_num_shots_draws_dassls_few_shot_training_split(name, wilds_root, tmp_path):
    """DATASET.NUM_SHOTS 1: the training items Dassl's WILDSBase keeps after ``set_random_seed(5)``
    (one of each label in each metadata domain, drawn with Python's RNG), in its order."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    root = shutil.copytree(wilds_root, tmp_path / "r")
    cfg = get_cfg_default()
    cfg.DATASET.ROOT, cfg.DATASET.NUM_SHOTS = str(root), 1
    import random

    random.seed(5)  # as Dassl's set_random_seed(SEED) leaves Python's RNG before the dataset is read
    ref = DATASET_REGISTRY.get(name)(cfg)
    ours = load_splits(name, str(root), ["train"], ["test"], seed=5, options={"NUM_SHOTS": 1})
    assert [tuple(i) for i in ours["train_x"]] == [(d.impath, d.label, d.domain, d.classname) for d in ref.train_x]
    whole = load_splits(name, str(root), ["train"], ["test"])["train_x"]
    # Camelyon17 holds 2 of a label in a hospital: a draw; the others 1: every item, grouped by domain
    assert len(ours["train_x"]) < len(whole) if name == "Camelyon17" else sorted(ours["train_x"]) == sorted(whole)


def test_num_shots_keeps_that_many_of_each_label_in_each_domain(wilds_root):
    """Camelyon17's 12 training patches: hospitals (domains 2, 0, 1 in the metadata's order) of 4, 2 of
    each label. NUM_SHOTS 1 keeps one of each label in each hospital, hospitals and labels in the order
    they first appear, drawn from the seed; 2 keeps them all; the fingerprint marks the source seeded."""
    from yacs.config import CfgNode as CN

    from dael_plugin.data.fingerprint import seeded_domains

    whole = load_splits("Camelyon17", wilds_root, ["train"], ["test"])["train_x"]
    picks = set()
    for seed in range(8):
        few = load_splits("Camelyon17", wilds_root, ["train"], ["test"], seed=seed, options={"NUM_SHOTS": 1})
        groups = [(i.domain, i.label) for i in few["train_x"]]
        first = list(dict.fromkeys((i.domain, i.label) for i in whole))
        assert groups == sorted(first, key=lambda g: ([2, 0, 1].index(g[0]), first.index(g)))  # one of each
        assert set(few["train_x"]) <= set(whole)
        picks.add(tuple(few["train_x"]))
    assert len(picks) > 1  # drawn from the seed
    two = load_splits("Camelyon17", wilds_root, ["train"], ["test"], seed=3, options={"NUM_SHOTS": 2})["train_x"]
    assert sorted(two) == sorted(whole)
    ds = CN({"NAME": "Camelyon17", "SOURCE_DOMAINS": ["train"], "TARGET_DOMAINS": ["test"], "NUM_SHOTS": -1})
    assert seeded_domains(ds) == ()
    ds.NUM_SHOTS = 1
    assert seeded_domains(ds) == ("train",)


def test_wilds_items_by_hand(wilds_root):
    """The fixture's items worked out by hand from its metadata. IWildCam's training cameras 1, 8, 9 are
    numbered in a Python set's order (8, 1, 9 -> 0, 1, 2), as Dassl's reader numbers them; sorted order
    would give 0, 1, 2 to 1, 8, 9."""
    cam = load_splits("IWildCam", wilds_root, ["train"], ["test"])
    folder = "iwildcam_v2.0/train"
    assert _rel(wilds_root, cam["train_x"]) == [
        (f"{folder}/0000.jpg", 0, 1, "giraffe"),
        (f"{folder}/0001.jpg", 1, 0, "dog"),
        (f"{folder}/0002.jpg", 2, 2, "house"),
        (f"{folder}/0003.jpg", 1, 1, "dog"),
        (f"{folder}/0004.jpg", 0, 0, "giraffe"),
    ]
    assert [os.path.basename(i.impath) for i in cam["val"]] == ["0005.jpg", "0006.jpg"]  # the OOD val
    assert [os.path.basename(i.impath) for i in cam["test"]] == ["0007.jpg", "0008.jpg", "0009.jpg"]
    assert cam["classnames"] == ["giraffe", "dog", "house"]  # Dassl's: the largest training label + 1
    fmow = load_splits("FMoW", wilds_root, ["train"], ["test"])
    # the 'seq' row (image 2) is in no split, yet the image indices count it
    names = [os.path.basename(i.impath) for i in fmow["train_x"]]
    assert names == [f"rgb_img_{k}.png" for k in (0, 1, 3, 4, 5, 11)]
    assert len(fmow["classnames"]) == 62 and fmow["classnames"][12] == "dam"
    camelyon = load_splits("Camelyon17", wilds_root, ["train"], ["test"])
    # hospitals 4, 0, 3 in the metadata's order -> a set {0, 3, 4} -> 2, 0, 1; each slide's third patch is
    # WILDS's in-distribution val (split 1), in no split here
    assert [i.domain for i in camelyon["train_x"]] == [2] * 4 + [0] * 4 + [1] * 4
    assert {i.domain for i in camelyon["val"] + camelyon["test"]} == {0}


def test_the_metadata_domains_named_as_sources_number_the_items_by_their_names(wilds_root):
    """Hand-worked: named hospital_4, hospital_0, hospital_3, Camelyon17's training patches of
    hospital 4 (slides 40, 41) are of domain 0, hospital 0's of 1, hospital 3's of 2 (Dassl's set order
    would give 2, 0, 1). Named in sorted order they are 0, 1, 2 for hospitals 0, 3, 4. The items, in
    their order, and the val and test splits are those of the one source ``train``; so is NUM_SHOTS's
    draw. FMoW's and iWildCam's names, and what names a split's domains wrongly, by hand."""
    from yacs.config import CfgNode as CN

    from dael_plugin.data.folders import apply_official_split

    whole = load_splits("Camelyon17", wilds_root, ["train"], ["test"])
    named = load_splits("Camelyon17", wilds_root, ["hospital_4", "hospital_0", "hospital_3"], ["test"])
    slide = {40: 0, 41: 0, 0: 1, 1: 1, 30: 2, 31: 2}  # hospital 4 -> 0, 0 -> 1, 3 -> 2 as named
    assert [i.domain for i in named["train_x"]] == [
        slide[int(i.impath.split("patient_")[1][:3])] for i in whole["train_x"]
    ]
    assert [i.domain for i in named["train_x"]] == [0] * 4 + [1] * 4 + [2] * 4
    assert [i._replace(domain=0) for i in named["train_x"]] == [i._replace(domain=0) for i in whole["train_x"]]
    assert all(named[k] == whole[k] for k in ("val", "test", "classnames"))
    ordered = load_splits("Camelyon17", wilds_root, ["hospital_0", "hospital_3", "hospital_4"], ["test"])
    assert [i.domain for i in ordered["train_x"]] == [2] * 4 + [0] * 4 + [1] * 4
    for seed in (0, 1, 2):
        shots = {"NUM_SHOTS": 1}
        few = load_splits("Camelyon17", wilds_root, ["train"], ["test"], seed=seed, options=shots)["train_x"]
        few_named = load_splits(
            "Camelyon17", wilds_root, ["hospital_0", "hospital_3", "hospital_4"], ["test"], seed, options=shots
        )
        assert [i.impath for i in few_named["train_x"]] == [i.impath for i in few]
    fmow = load_splits(
        "FMoW", wilds_root, ["Asia_2003", "Europe_2010", "Asia_2010", "Europe_2011", "Other_2005"], ["test"]
    )
    assert [i.domain for i in fmow["train_x"]] == [0, 1, 2, 3, 0, 4]  # images 0, 1, 3, 4, 5, 11
    cams = load_splits("IWildCam", wilds_root, ["location_9", "location_1", "location_8"], ["test"])
    assert [i.domain for i in cams["train_x"]] == [1, 2, 0, 1, 2]  # cameras 1, 8, 9, 1, 8
    # cameras that hold other classes (camera 9: house alone): category shift reads the same items
    shift = load_splits(
        "IWildCam", wilds_root, ["location_9", "location_1", "location_8"], ["test"], category_shift=True
    )
    assert shift == cams
    held = r"\['hospital_0', 'hospital_3', 'hospital_4'\]"
    with pytest.raises(
        DAELConfigError, match=rf"holds the metadata domains {held}, not \['hospital_0', 'hospital_1'\]"
    ):
        load_splits("Camelyon17", wilds_root, ["hospital_0", "hospital_1"], ["test"])
    with pytest.raises(DAELConfigError, match="not \\['hospital_0', 'hospital_3'\\]: name each of them once"):
        load_splits("Camelyon17", wilds_root, ["hospital_0", "hospital_3"], ["test"])  # one left out
    ds = CN({"NAME": "Camelyon17", "SOURCE_DOMAINS": ["hospital_0", "hospital_3"], "TARGET_DOMAINS": []})
    apply_official_split(ds)
    assert ds.TARGET_DOMAINS == ["test"]  # (the names are the reader's to check)
    ds.SOURCE_DOMAINS = ["hospital_0", "hospital_0", "hospital_3"]
    with pytest.raises(DAELConfigError, match=r"every metadata domain of its train split, once each"):
        apply_official_split(ds)
    ds = CN({"NAME": "CIFAR10", "SOURCE_DOMAINS": ["cifar10"], "TARGET_DOMAINS": []})  # not WILDS: its split alone
    with pytest.raises(DAELConfigError, match=r"brings its own split, source \['labeled'\] -> target"):
        apply_official_split(ds)


def test_dassls_pickled_items_are_never_read(wilds_root, tmp_path):
    """Dassl's reader unpickles ``zhou_preloaded.pkl`` from the data folder whatever the metadata says
    by then; this reader reads the metadata. A hostile or stale pickle there changes nothing."""
    root = shutil.copytree(wilds_root, tmp_path / "r")
    before = load_splits("Camelyon17", str(root), ["train"], ["test"])
    with open(root / "camelyon17_v1.0" / "zhou_preloaded.pkl", "wb") as f:
        f.write(b"cos\nsystem\n(S'touch " + str(tmp_path / "owned").encode() + b"'\ntR.")
    after = load_splits("Camelyon17", str(root), ["train"], ["test"])
    assert after == before and not (tmp_path / "owned").exists()


def test_what_cannot_be_read_is_one_line(wilds_root, tmp_path, monkeypatch):
    from dael_plugin.data.folders import apply_official_split
    from dael_plugin.data.wilds_formats import DOWNLOADS

    root = shutil.copytree(wilds_root, tmp_path / "r")
    os.remove(root / "fmow_v1.1" / "RELEASE_v1.1.txt")
    with pytest.raises(DAELConfigError, match=r"RELEASE_v1.1.txt not found .* holds \['country_code_mapping.csv'"):
        load_splits("FMoW", str(root), ["train"], ["test"])
    with pytest.raises(DAELConfigError, match="fmow_v1.1 does not exist"):
        load_splits("FMoW", str(tmp_path / "nothing"), ["train"], ["test"])
    (root / "iwildcam_v2.0" / "metadata.csv").write_text("split,filename\ntrain,a.jpg\n")
    with pytest.raises(DAELConfigError, match=f"wilds could not read the metadata .*{DOWNLOADS}"):
        load_splits("IWildCam", str(root), ["train"], ["test"])
    with pytest.raises(DAELConfigError, match="DATASET.CATEGORY_SHIFT has no domains to differ"):
        load_splits("Camelyon17", str(root), ["train"], ["test"], category_shift=True)
    monkeypatch.setitem(__import__("sys").modules, "wilds", None)  # the package not installed
    with pytest.raises(DAELConfigError, match="pip install wilds"):
        load_splits("Camelyon17", str(root), ["train"], ["test"])
    from yacs.config import CfgNode as CN

    ds = CN({"NAME": "Camelyon17", "SOURCE_DOMAINS": [], "TARGET_DOMAINS": []})
    apply_official_split(ds)
    assert (ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS) == (["train"], ["test"])
    ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS = ["test"], ["train"]
    with pytest.raises(DAELConfigError, match=r"brings its own split, source \['train'\] .* not \['test'\]"):
        apply_official_split(ds)


def _argv(engine, root, out, trainer="Vanilla", *opts):
    from conftest import ROOT

    argv = ["--engine", engine, "--trainer", trainer, "--root", str(root), "--output-dir", str(out), "--seed", "1"]
    argv += ["--dataset-config-file", os.path.join(ROOT, "configs/datasets/dg/camelyon17.yaml"), "--"]
    argv += ["MODEL.BACKBONE.NAME", "dael_small_cnn", "INPUT.SIZE", "(32, 32)", "OPTIM.MAX_EPOCH", "1"]
    return argv + ["DATALOADER.TRAIN_X.BATCH_SIZE", "4", "DATALOADER.NUM_WORKERS", "0", *opts]


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_run_names_the_split_and_validates_on_its_own_source(engine, wilds_root, tmp_path):
    """Dassl's dataset config (no domains) runs on either engine: the domains become train -> test;
    the fingerprint names the OOD val ``val``, not a source; source validation holds part of the train
    split out (WILDS's val is of other hospitals) and scores all of it, whatever its hospital."""
    from conftest import run_here

    out = tmp_path / "out"
    opts = ["SELECTION.EVAL_FREQ", "1", "SELECTION.HOLDOUT_FRACTION", "0.5"]
    done = run_here(_argv(engine, shutil.copytree(wilds_root, tmp_path / "r"), out, "Vanilla", *opts))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert (res["source_domains"], res["target_domains"], res["setting"]) == (["train"], ["test"], "DG")
    assert {s: list(d) for s, d in res["data"].items()} == {"train_x": ["train"], "val": ["val"], "test": ["test"]}
    assert res["data"]["val"]["val"]["images"] == 6 and res["data"]["test"]["test"]["images"] == 6
    held = res["source_val_split"]
    assert held["kind"].startswith("held out of each source domain's train split")
    assert held["per_domain"] == {"train": 6} and held["size"] == 6  # half of the 12 training images
    assert res["wilds_metrics"]["acc_avg"] == pytest.approx(res["accuracy"] / 100, abs=1e-5)  # WILDS's figures
    assert set(res["wilds_metrics"]) == {"acc_avg", "acc_wg"}
    record = json.loads((out / "epochs.jsonl").read_text().splitlines()[-1])
    assert record["source_val_size"] == held["size"] and list(record["source_val_accuracy_per_domain"]) == ["train"]
    # WILDS's model selection: the OOD val, whole, scored every epoch for the val protocol
    assert record["val_size"] == 6 and record["val_accuracy"] in [round(100 * k / 6, 4) for k in range(7)]
    assert (out / "model-best-val.pth.tar").exists()


def test_the_val_protocol_reads_the_datasets_own_val_and_nothing_else():
    """Hand-worked: the val split's outputs 1 of 2 right, the test's 2 of 2: val_accuracy 50, read by
    the val protocol; a dataset whose val is of its sources has no own val (source_val scores it)."""
    from dael_plugin.data.folders import own_val
    from dael_plugin.engine.selection import Outputs, Scoring, epoch_record, protocol_score

    def outs(right):
        probs = torch.tensor([[[0.9, 0.1]], [[0.2, 0.8]]])
        return Outputs(torch.zeros(2, 3), probs, torch.tensor([0, 1 if right else 0]), torch.zeros(2, dtype=torch.long))

    rec = epoch_record(1, {"val": outs(False), "test": outs(True)}, Scoring(["train"], 2, 0.95, 0, (), False))
    assert (rec["val_accuracy"], rec["val_size"], rec["target_test_accuracy"]) == (50.0, 2, 100.0)
    assert protocol_score(rec, "val") == 50.0 and protocol_score({"epoch": 1}, "val") is None
    assert (
        own_val("Camelyon17", ["v"]) == ["v"] and own_val("CIFAR10", ["v"]) == ["v"] and own_val("PACS", ["v"]) is None
    )


@pytest.mark.parametrize(
    "engine, trainer",
    [("builtin", "CrossGrad"), ("builtin", "DDAIG"), pytest.param("dassl", "CrossGrad", marks=pytest.mark.dassl)]
    + [("builtin", "DAELDG")],
)
def test_a_method_with_an_output_per_source_domain_is_one_line(engine, trainer, wilds_root, tmp_path, capsys):
    """Its outputs would be indexed by the hospitals' numbers, past the one named source (Dassl's
    CrossGrad stops on ``Target 1 is out of bounds``); the line names the way to one per hospital."""
    from test_hardening import cli, one_error_line

    opts = ["TRAINER.DDAIG.G_ARCH", "fcn_3x32_gctx"] if trainer == "DDAIG" else []
    code, _, err = cli(_argv(engine, wilds_root, tmp_path / "out", trainer, *opts), capsys)
    line = one_error_line(err)
    if trainer == "DAELDG":  # (its check of the config comes first)
        assert code == 2 and "got ['train']" in line and "name its train split's metadata domains" in line, err
        return
    assert code == 2 and "learns one output per source domain" in line and "Vanilla, DomainMix" in line, err
    assert "name those domains with --source-domains" in line or "metadata domains with --source-domains" in line
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize(
    "engine, trainer",
    [("builtin", "DAELDG"), pytest.param("dassl", "DAELDG", marks=pytest.mark.dassl), ("builtin", "DDAIG")]
    + [pytest.param("dassl", "CrossGrad", marks=pytest.mark.dassl)],  # (Dassl's own CrossGrad)
)
def test_a_method_with_an_output_per_source_domain_has_one_per_named_metadata_domain(
    engine, trainer, wilds_root, tmp_path
):
    """Camelyon17's hospitals named as the sources: DAELDG trains three experts, one per hospital, on
    both engines (on Dassl's loop through the plugin's reader, which numbers them as named); the records,
    the fingerprint and results.json name the hospitals; the test split and WILDS's figures are the
    official ones. DDAIG and Dassl's own CrossGrad train their domain classifiers on three classes."""
    from conftest import run_here

    out, hospitals = tmp_path / "out", ["hospital_4", "hospital_0", "hospital_3"]
    opts = ["SELECTION.EVAL_FREQ", "1", "SELECTION.HOLDOUT_FRACTION", "0.5", "DATALOADER.TRAIN_X.BATCH_SIZE", "3"]
    if trainer == "DAELDG":
        opts += [
            "DATALOADER.TRAIN_X.SAMPLER",
            "RandomDomainSampler",
            "TRAINER.DAELDG.STRONG_TRANSFORMS",
            "['normalize']",
        ]
    opts += ["TRAINER.DDAIG.G_ARCH", "fcn_3x32_gctx"] if trainer == "DDAIG" else []
    root = shutil.copytree(wilds_root, tmp_path / "r")
    argv = _argv(engine, root, out, trainer, *opts)
    at = argv.index("--dataset-config-file")
    done = run_here(argv[:at] + ["--source-domains", *hospitals] + argv[at:])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert (res["source_domains"], res["target_domains"], res["setting"]) == (hospitals, ["test"], "DG")
    assert {d: v["images"] for d, v in res["data"]["train_x"].items()} == dict.fromkeys(hospitals, 4)
    # each hospital's own images (Dassl's reader would number hospitals 0, 3, 4 as 0, 1, 2 whatever the names)
    from dael_plugin.data.fingerprint import data_fingerprint

    own = load_splits("Camelyon17", str(root), hospitals, ["test"])["train_x"]
    assert res["data"]["train_x"] == data_fingerprint({"train_x": own}, hospitals, ["test"], str(root))["train_x"]
    assert list(res["data"]["test"]) == ["test"] and res["data"]["test"]["test"]["images"] == 6
    assert res["source_val_split"]["per_domain"] == dict.fromkeys(hospitals, 2)
    assert set(res["wilds_metrics"]) == {"acc_avg", "acc_wg"}
    record = json.loads((out / "epochs.jsonl").read_text().splitlines()[-1])
    assert sorted(record["source_val_accuracy_per_domain"]) == sorted(hospitals)  # (written with sorted keys)
    if trainer == "DAELDG":
        line = done.stdout.split("expert accuracy: ", 1)[1].splitlines()[0]  # one figure per expert, as named
        assert [part.split()[0] for part in line.split(", ")] == hospitals, line


def test_a_hospital_too_small_for_its_share_of_a_batch_is_named(wilds_root, tmp_path, capsys):
    """Dassl's RandomDomainSampler cannot fill a batch from a hospital of 4 patches at 10 a domain:
    the line names the hospital, as the run names it, not its number."""
    from test_hardening import cli, one_error_line

    opts = ["DATALOADER.TRAIN_X.SAMPLER", "RandomDomainSampler", "DATALOADER.TRAIN_X.BATCH_SIZE", "30"]
    opts += ["TRAINER.DAELDG.STRONG_TRANSFORMS", "['normalize']"]
    argv = _argv("builtin", wilds_root, tmp_path / "out", "DAELDG", *opts)
    at = argv.index("--dataset-config-file")
    code, _, err = cli(argv[:at] + ["--source-domains", "hospital_4", "hospital_0", "hospital_3"] + argv[at:], capsys)
    line = one_error_line(err)
    assert code == 2 and "source domain 'hospital_4' has 4 training images" in line, err


def test_metadata_domains_too_small_for_a_batch_are_named_under_the_one_source(wilds_root, tmp_path):
    """Under the one source ``train`` the sampler's domains are its metadata's: the warning of a
    cycled domain (and the line of one Dassl's sampler cannot fill) names ``train's metadata domain
    d``. It took the run's source list by that number and stopped in an IndexError."""
    from conftest import run_here

    opts = ["DATALOADER.TRAIN_X.SAMPLER", "CyclingDomainSampler", "DATALOADER.TRAIN_X.BATCH_SIZE", "30"]
    done = run_here(_argv("builtin", wilds_root, tmp_path / "out", "Vanilla", *opts))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for d in range(3):
        assert f'warning: source domain "train\'s metadata domain {d}" has 4 training images' in done.stdout
    opts[1] = "RandomDomainSampler"
    done = run_here(_argv("builtin", wilds_root, tmp_path / "out2", "Vanilla", *opts))
    assert done.returncode == 2 and 'source domain "train\'s metadata domain 0" has 4' in done.stderr, done.stderr


@pytest.mark.dassl
def test_dassls_own_sampler_that_cannot_fill_a_batch_is_one_line(wilds_root, tmp_path, capsys):
    """Dassl's RandomDomainSampler draws its epoch as it is built, with ``random.sample``: 10 patches
    of a hospital of 4 stopped Dassl's own Vanilla in a ValueError's stack."""
    from test_hardening import cli, one_error_line

    opts = ["DATALOADER.TRAIN_X.SAMPLER", "RandomDomainSampler", "DATALOADER.TRAIN_X.BATCH_SIZE", "30"]
    code, _, err = cli(_argv("dassl", wilds_root, tmp_path / "out", "Vanilla", *opts), capsys)
    line = one_error_line(err)
    assert code == 2 and "Dassl's RandomDomainSampler cannot draw its first batch of 30" in line, err
    assert "lower DATALOADER.TRAIN_X.BATCH_SIZE or N_DOMAIN" in line


def test_a_sweep_runs_the_official_split(tmp_path):
    from conftest import ROOT
    from dael_plugin.tools.sweep import build_parser
    from dael_plugin.tools.sweep_plan import plan

    ds = os.path.join(ROOT, "configs/datasets/dg/iwildcam.yaml")
    args = build_parser().parse_args(
        ["--root", str(tmp_path), "--dataset-config-file", ds, "--trainers", "Vanilla", "--seeds", "1", "2"]
        + ["--output-dir", str(tmp_path / "sweep")]
    )
    runs = plan(args)
    assert [(dict(r.identity)["sources"], dict(r.identity)["target"]) for r in runs] == [("train", "test")] * 2
    # Camelyon17's hospitals as the sources: DAELDG's shipped config, each run naming them
    ds, hospitals = (
        os.path.join(ROOT, "configs/datasets/dg/camelyon17.yaml"),
        ["hospital_0", "hospital_3", "hospital_4"],
    )
    args = build_parser().parse_args(
        ["--root", str(tmp_path), "--dataset-config-file", ds, "--trainers", "DAELDG", "--sources", *hospitals]
        + ["--output-dir", str(tmp_path / "sweep")]
    )
    (run,) = plan(args)
    config = os.path.join(ROOT, "configs/trainers/dg/daeldg/camelyon17.yaml")
    assert (run.sources, run.target, run.config_file) == (tuple(hospitals), "test", config)
    assert run.argv[run.argv.index("--source-domains") + 1 :][:4] == (*hospitals, "--target-domains")


def test_one_named_source_of_many_domains_is_counted_whole():
    """Hand-worked: one named source whose items carry metadata domains 0, 1, 2. Source validation
    scores all four items (3 right: 75%); read by domain number, only domain 0's two items would count
    (1 right: 50%). The fingerprint, the class table and a resume's counts take every item too."""
    from dael_plugin.data.classes import classes_by_domain
    from dael_plugin.data.fingerprint import data_fingerprint
    from dael_plugin.data.items import Item
    from dael_plugin.engine import selection as S
    from dael_plugin.engine.checkpoint import train_counts

    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.6, 0.4]]).unsqueeze(1)  # (N, K=1, C=2)
    labels, domains = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 2, 1, 0])  # predicted 0, 1, 0, 0
    val = S.Outputs(torch.zeros(4, 3), probs, labels, domains)
    rec = S.epoch_record(1, {"source_val": val}, S.Scoring(["train"], 2, 0.95, 0, (), da=False))
    assert rec["source_val_accuracy_per_domain"] == {"train": 75.0} and rec["source_val_accuracy"] == 75.0
    items = [Item(f"/r/{k}.png", int(y), int(d), "c") for k, (y, d) in enumerate(zip(labels, domains))]
    fp = data_fingerprint({"train_x": items}, ["train"], ["test"], "/r")
    assert fp["train_x"]["train"]["images"] == 4
    assert classes_by_domain(items, 1, 2) == [[True, True]]
    assert train_counts(["train"], [it.domain for it in items], ["test"], None) == {"train": 4}


def _scatter_mean(src, index, dim_size, reduce="mean"):
    """torch_scatter's one function wilds' group averages call (a compiled extension, not installed
    here): each group's mean, 0 for an empty group, by torch's own scatter_reduce."""
    assert reduce == "mean"
    return torch.zeros(dim_size, dtype=src.dtype).scatter_reduce(0, index, src, "mean", include_self=False)


@pytest.mark.parametrize("name", WILDS)
@pytest.mark.parametrize("split", ["test", "val"])
def test_wilds_figures_are_wilds_own(name, split, wilds_root, monkeypatch):
    """Each figure is what wilds' own ``eval`` of the dataset reports for the same predictions (its
    group averages given torch_scatter's scatter-mean by torch's scatter_reduce), over seeds of
    random predictions (16: several where only the "Other" region errs)."""
    import types

    from wilds import get_dataset

    from dael_plugin.data.wilds_formats import _FORMATS, official_metrics

    monkeypatch.setitem(__import__("sys").modules, "torch_scatter", types.SimpleNamespace(scatter=_scatter_mean))
    fmt = _FORMATS[name]
    data = get_dataset(dataset=fmt.wilds_name, version=fmt.version, root_dir=wilds_root, download=False)
    subset = data.get_subset(split)
    y = torch.as_tensor(data.y_array[subset.indices]).long()
    for seed in range(16):
        g = torch.Generator().manual_seed(seed)
        pred = torch.where(torch.rand(len(y), generator=g) < 0.5, y, torch.randint(0, 62, (len(y),), generator=g))
        ours, _ = official_metrics(name, wilds_root, split, y.tolist(), pred.tolist())
        theirs, _ = data.eval(pred, y, data.metadata_array[subset.indices])
        assert ours == {k: pytest.approx(float(theirs[k]), abs=1e-6) for k in ours}, (seed, ours, theirs)


def test_fmows_worst_region_leaves_other_out_by_hand(wilds_root, capsys):
    """The fixture's FMoW test split: Asia 2016 (dam), Europe 2017 (airport), a country of no region
    ("Other") 2016 (zoo), predicted dam, airport, airport. Average 2/3; worst region 1.0 (Asia and
    Europe; over every region, Other's 0 would make it 0.0); worst year 0.5 (2016: 1 of 2)."""
    from dael_plugin.data.wilds_formats import FMOW_CATEGORIES, official_metrics

    dam, airport, zoo = (FMOW_CATEGORIES.index(c) for c in ("dam", "airport", "zoo"))
    metrics, _ = official_metrics("FMoW", wilds_root, "test", [dam, airport, zoo], [dam, airport, airport])
    assert metrics == {"acc_avg": 0.666667, "acc_worst_region": 1.0, "acc_worst_year": 0.5}
    assert official_metrics("FMoW", wilds_root, "test", [dam, airport], [dam, airport]) is None  # an item unscored
    assert official_metrics("FMoW", wilds_root, "test", [zoo, airport, dam], [dam, airport, airport]) is None
    assert "are not WILDS's test split" in capsys.readouterr().out  # labels of other items: no figure
    assert official_metrics("PACS", wilds_root, "test", [0], [0]) is None


def test_a_tally_in_item_order_needs_every_item():
    from dael_plugin.engine.evaluate import ExpertTally

    tally = ExpertTally()
    probs = torch.nn.functional.one_hot(torch.tensor([2, 0]), 3).float()[:, None]
    tally.update(probs, torch.tensor([2, 1]), torch.tensor([3, 1]))
    tally.update(probs[:1], torch.tensor([0]), torch.tensor([0]))
    assert tally.in_item_order(3) is None  # item 2 unscored (an unreadable image left out)
    tally.update(probs[1:], torch.tensor([1]), torch.tensor([2]))
    labels, preds = tally.in_item_order(4)
    assert labels.tolist() == [0, 1, 1, 2] and preds.tolist() == [2, 0, 0, 2]


def test_check_data_counts_a_test_label_past_the_classes(wilds_root):
    """iWildCam's fixture tests one image of label 3, which no training image has: Dassl's classes stop
    at the largest training label (2), and the table still counts that image, in a row of its own."""
    from dael_plugin.data.check import count_table
    from dael_plugin.data.fingerprint import split_names

    s = load_splits("IWildCam", wilds_root, ["train"], ["test"])
    splits = {k: s[k] for k in ("train_x", "val", "test")}
    lines = count_table(splits, split_names(["train"], ["test"], "IWildCam"), s["classnames"])
    assert [line.split() for line in lines[-2:]] == [["3", "(no", "class)", "0", "0", "1"], ["all", "5", "2", "3"]]
