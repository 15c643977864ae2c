"""Dassl's dataset formats read without Dassl (dael_plugin/data/dassl_formats.py), Dassl's digit
backbones rebuilt (dael_plugin/backbones/dassl_cnns.py), and missing data in one line."""

from __future__ import annotations

import functools
import os
import random
import re
import shutil

import dassl_layouts as layouts
import pytest
import torch

from dael_plugin.data.dassl_formats import DIGIT5_CAPS
from dael_plugin.data.folders import load_splits
from dael_plugin.errors import DAELConfigError

# name: (sources, target) of the fixture's runs
RUNS = {
    "DomainNet": (["clipart", "painting", "real"], ["sketch"]),
    "miniDomainNet": (["clipart", "painting", "real"], ["sketch"]),
    "Office31": (["amazon", "webcam"], ["dslr"]),
    "OfficeHome": (["art", "clipart", "product"], ["real_world"]),
    "PACS": (["art_painting", "cartoon", "photo"], ["sketch"]),
    "VLCS": (["caltech", "labelme", "pascal"], ["sun"]),
    "Digit5": (["mnist_m", "svhn", "syn", "usps"], ["mnist"]),
}
# Dassl's datasets of one source domain (VisDA17, CIFARSTL) or of a DG protocol without a class
# layout to take away from one source (DigitSingle): not in the category-shift tests
OTHER_RUNS = {
    "VisDA17": (["synthetic"], ["real"]),
    "CIFARSTL": (["cifar"], ["stl"]),
    "DigitSingle": (["mnist", "usps"], ["svhn", "syn"]),
    "CIFAR10C": (["cifar10"], ["cifar10_c"]),
    "CIFAR100C": (["cifar100"], ["cifar100_c"]),
}
UNNAMED = ("VLCS", "CIFARSTL", "DigitSingle", "CIFAR10C", "CIFAR100C")  # Dassl names every class "": ours are
# the folders' or the digits
CIFAR_C = {"CIFAR_C_TYPE": "fog", "CIFAR_C_LEVEL": 5}  # DATASET's keys of the CIFAR-C runs


def _root(name, layouts_root, digit5_root):
    return digit5_root if name in ("Digit5", "DigitSingle") else layouts_root


def _tuples(items):
    return None if items is None else [(i.impath, i.label, i.domain, i.classname) for i in items]


@pytest.mark.dassl
@pytest.mark.parametrize("name", sorted(RUNS) + sorted(OTHER_RUNS))
def test_each_reader_gives_dassls_items(name, layouts_root, digit5_root):
    """Paths, labels, domains, class names and their order, split for split, as Dassl's own reader
    gives them on the same files (Digit-5: the same subsample, from the same seed)."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    root = _root(name, layouts_root, digit5_root)
    sources, targets = {**RUNS, **OTHER_RUNS}[name]
    cfg = get_cfg_default()
    cfg.DATASET.ROOT, cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS = root, sources, targets
    options = CIFAR_C if name.startswith("CIFAR") and name.endswith("C") else {}
    cfg.DATASET.update(options)
    random.seed(5)  # as Dassl's set_random_seed(SEED) leaves Python's RNG before the dataset is read
    ref = DATASET_REGISTRY.get(name)(cfg)
    ours = load_splits(name, root, sources, targets, seed=5, options=options)
    for split in ("train_x", "train_u", "val", "test"):
        want = _tuples(getattr(ref, split) or None)
        got = _tuples(ours[split])
        if name in UNNAMED and got:  # Dassl leaves these class names empty
            got = [(p, label, d, "") for p, label, d, _ in got]
        assert got == want, (name, split)
    assert ours["train_x"], name
    if name in UNNAMED:
        assert (
            set(ref.classnames) == {""} and all(ours["classnames"]) and len(ours["classnames"]) == len(ref.classnames)
        )
    else:
        assert ours["classnames"] == ref.classnames


def _digit5_listing(root, d, split):
    folder = os.path.join(root, "digit5", d, f"{split}_images")
    return [os.path.join(folder, f) for f in os.listdir(folder)]


def _rel(root, items):
    return [(os.path.relpath(i.impath, root), i.label, i.domain, i.classname) for i in items]


def test_split_file_formats_give_the_hand_written_items(layouts_root):
    """DomainNet's and PACS's lists, written out by hand for the fixture: the file's order, the
    labels as written (PACS: minus one), the class from the path, Dassl's broken sketch skipped."""
    s = load_splits("DomainNet", layouts_root, ["real"], ["sketch"])
    dn = os.path.join(layouts_root, "domainnet")
    assert _rel(dn, s["test"]) == [
        ("sketch/house/sketch_test_000.jpg", 2, 0, "house"),
        ("sketch/house/sketch_test_001.jpg", 2, 0, "house"),
        ("sketch/dog/sketch_test_000.jpg", 0, 0, "dog"),
        ("sketch/dog/sketch_test_001.jpg", 0, 0, "dog"),
        ("sketch/giraffe/sketch_test_000.jpg", 1, 0, "giraffe"),
        ("sketch/giraffe/sketch_test_001.jpg", 1, 0, "giraffe"),
    ]
    assert _rel(dn, s["val"]) == [(p.replace("sketch", "real"), lab, 0, c) for p, lab, _, c in _rel(dn, s["test"])]
    assert [(r[0], r[1]) for r in _rel(dn, s["train_x"])][:4] == [
        ("real/house/real_train_000.jpg", 2),
        ("real/house/real_train_001.jpg", 2),
        ("real/house/real_train_002.jpg", 2),
        ("real/dog/real_train_000.jpg", 0),
    ]
    assert s["classnames"] == ["dog", "giraffe", "house"]
    assert load_splits("miniDomainNet", layouts_root, ["real"], ["sketch"])["val"] is None  # no val in mini

    s = load_splits("PACS", layouts_root, ["photo", "sketch"], ["cartoon"])
    images = os.path.join(layouts_root, "pacs", "images")
    assert _rel(images, s["train_x"]) == [
        ("photo/house/train_0.png", 2, 0, "house"),
        ("photo/house/train_1.png", 2, 0, "house"),
        ("photo/dog/train_0.png", 0, 0, "dog"),
        ("photo/dog/train_1.png", 0, 0, "dog"),
        ("photo/giraffe/train_0.png", 1, 0, "giraffe"),
        ("photo/giraffe/train_1.png", 1, 0, "giraffe"),
        ("sketch/house/train_0.png", 2, 1, "house"),  # the broken sketch listed next is skipped
        ("sketch/house/train_1.png", 2, 1, "house"),
        ("sketch/dog/train_0.png", 0, 1, "dog"),
        ("sketch/dog/train_1.png", 0, 1, "dog"),
        ("sketch/giraffe/train_0.png", 1, 1, "giraffe"),
        ("sketch/giraffe/train_1.png", 1, 1, "giraffe"),
    ]
    assert [r[0] for r in _rel(images, s["val"])][:2] == ["photo/house/crossval_0.png", "photo/house/crossval_1.png"]
    test = [r[0] for r in _rel(images, s["test"])]  # the target's train list, then its crossval list
    assert test[:2] == ["cartoon/house/train_0.png", "cartoon/house/train_1.png"] and len(test) == 12
    assert test[6:8] == ["cartoon/house/crossval_0.png", "cartoon/house/crossval_1.png"]
    assert s["train_u"] is None


def test_class_folder_formats_give_the_hand_written_items(layouts_root):
    """Office-31, Office-Home and VLCS, for the fixture: labels by sorted class folder, every image
    of a domain in each of its splits (Office), the split's own folder (VLCS), *.jpg only. Within a
    class folder the order is the folder listing's, as in Dassl; compared here as a set."""
    s = load_splits("Office31", layouts_root, ["amazon"], ["dslr"])
    root = os.path.join(layouts_root, "office31")
    want_dslr = {
        (f"dslr/{c}/img_{k:03d}.jpg", lab, 0, c) for lab, c in enumerate(["Dog", "Giraffe", "House"]) for k in range(3)
    }
    assert set(_rel(root, s["test"])) == want_dslr == set(_rel(root, s["train_u"]))
    assert [r[1] for r in _rel(root, s["test"])] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert s["classnames"] == ["Dog", "Giraffe", "House"] and s["val"] is None

    s = load_splits("OfficeHome", layouts_root, ["art"], ["product"])
    assert s["classnames"] == ["dog", "giraffe", "house"]  # lower-cased, as Dassl's OfficeHome
    assert {os.path.relpath(i.impath, layouts_root) for i in s["test"]} == {
        f"office_home/product/{c}/img_{k:03d}.jpg" for c in ("Dog", "Giraffe", "House") for k in range(3)
    }

    s = load_splits("VLCS", layouts_root, ["caltech", "sun"], ["pascal"])
    root = os.path.join(layouts_root, "VLCS")
    assert set(_rel(root, s["val"])) == {
        (f"{d.upper()}/crossval/{c}/{k}.jpg", lab, di, c)
        for di, d in enumerate(("caltech", "sun"))
        for lab, c in enumerate(["dog", "giraffe", "house"])
        for k in range(2)
    }
    assert {r[0].split("/")[1] for r in _rel(root, s["test"])} == {"test"} and len(s["test"]) == 6
    assert not any(i.impath.endswith(".txt") for i in s["train_x"])


def test_one_source_formats_give_the_hand_written_items(layouts_root, tmp_path):
    """VisDA17: the list files' order and labels, the class from the path, every item domain 0, the
    real images both unlabeled and test. CIFARSTL: the label is the class folder's number."""
    s = load_splits("VisDA17", layouts_root, ["synthetic"], ["real"])
    root = os.path.join(layouts_root, "visda17")
    assert _rel(root, s["train_x"]) == [
        ("train/house/train_000.png", 2, 0, "house"),
        ("train/house/train_001.png", 2, 0, "house"),
        ("train/dog/train_000.png", 0, 0, "dog"),
        ("train/dog/train_001.png", 0, 0, "dog"),
        ("train/giraffe/train_000.png", 1, 0, "giraffe"),
        ("train/giraffe/train_001.png", 1, 0, "giraffe"),
    ]
    assert (
        _rel(root, s["test"])
        == _rel(root, s["train_u"])
        == [(p.replace("train", "validation"), lab, d, c) for p, lab, d, c in _rel(root, s["train_x"])]
    )
    assert s["val"] is None and s["classnames"] == ["dog", "giraffe", "house"]
    for sources, targets in ((["real"], ["synthetic"]), (["synthetic"], ["synthetic"])):
        with pytest.raises(DAELConfigError, match="VisDA17 is synthetic -> real") as exc:
            load_splits("VisDA17", layouts_root, sources, targets)  # Dassl would read synthetic -> real
        assert "--source-domains synthetic --target-domains real" in str(exc.value)

    s = load_splits("CIFARSTL", layouts_root, ["stl"], ["cifar"])
    root = os.path.join(layouts_root, "cifar_stl")
    assert set(_rel(root, s["test"])) == {
        (f"cifar/test/{lab:03d}_{c}/{k:05d}.jpg", lab, 0, c) for lab, c in enumerate(layouts.CLASSES) for k in (1, 2)
    }
    assert {r[0].split("/")[1] for r in _rel(root, s["train_u"])} == {"train"} and len(s["train_u"]) == 6
    assert {r[0].split("/")[0] for r in _rel(root, s["train_x"])} == {"stl"}
    assert s["classnames"] == list(layouts.CLASSES) and s["val"] is None
    odd = tmp_path / "cifar_stl"
    shutil.copytree(os.path.join(layouts_root, "cifar_stl"), odd)
    for name in ("notes.txt", "003_cat"):  # a file among the class folders (Dassl: a traceback)
        (odd / "cifar" / "test" / name).write_text("")
        with pytest.raises(DAELConfigError, match=f"cifar_stl/cifar/test/{name}: class folders are <label>_<class>"):
            load_splits("CIFARSTL", str(tmp_path), ["stl"], ["cifar"])
        (odd / "cifar" / "test" / name).unlink()


def test_cifar_c_reads_the_corruption_and_level_asked_for(layouts_root, tmp_path, capsys):
    """CIFAR10C: the clean training images, and the test images of DATASET.CIFAR_C_TYPE at
    CIFAR_C_LEVEL (fog 5 and snow 1 are other files), every item domain 0, labels by sorted class
    folder. A corruption or level the set lacks, other domains, a level folder not there or a class
    missing from it (Dassl numbers each folder's classes on its own: the labels after it would
    shift) are one line each."""
    from dael_plugin.data.dassl_formats import CIFAR_C_TYPES

    def read(root=layouts_root, sources=("cifar10",), targets=("cifar10_c",), **opts):
        return load_splits("CIFAR10C", root, list(sources), list(targets), options={**CIFAR_C, **opts})

    s = read()
    classes = sorted(layouts.CLASSES)  # (within a class folder: the listing's order, as Dassl's)
    assert sorted(_rel(layouts_root, s["train_x"])) == [
        (f"cifar10/train/{c}/{k:05d}.png", label, 0, c) for label, c in enumerate(classes) for k in (0, 1)
    ]
    assert sorted(_rel(layouts_root, s["test"])) == [
        (f"cifar10_c/fog/5/{c}/{k:05d}.png", label, 0, c) for label, c in enumerate(classes) for k in (0, 1)
    ]
    assert s["train_u"] is None and s["val"] is None and s["classnames"] == sorted(layouts.CLASSES)
    assert {i.impath.split("/")[-3:-1][0] for i in read(CIFAR_C_TYPE="snow", CIFAR_C_LEVEL=1)["test"]} == {"1"}
    assert len(CIFAR_C_TYPES) == 19
    bad = [
        ({"CIFAR_C_TYPE": "fgo"}, "DATASET.CIFAR_C_TYPE 'fgo' is not a corruption of the set (did you mean 'fog'?)"),
        ({"CIFAR_C_TYPE": ""}, "DATASET.CIFAR_C_TYPE '' is not a corruption of the set; set it to one of"),
        ({"CIFAR_C_LEVEL": 6}, "DATASET.CIFAR_C_LEVEL 6: the corruption's severity is 1 to 5"),
        ({"CIFAR_C_LEVEL": 3}, "missing domain folder"),
        ({"targets": ("cifar10",)}, "this dataset is cifar10 -> cifar10_c"),
    ]
    for opts, said in bad:
        with pytest.raises(DAELConfigError, match=re.escape(said)):
            read(**opts)
    odd = tmp_path / "odd"
    for d in ("cifar10", "cifar10_c"):
        shutil.copytree(os.path.join(layouts_root, d), odd / d)
    shutil.rmtree(odd / "cifar10_c" / "fog" / "5" / "dog")
    with pytest.raises(DAELConfigError, match="class folders differ between .* missing \\['dog'\\]"):
        read(str(odd))


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_cifar_c_level_not_there_is_one_line_from_the_train_script(engine, layouts_root, tmp_path):
    """Dassl's own reader raises a bare ValueError for it; the plugin's reader goes first on both."""
    from conftest import ROOT, run_here

    out = tmp_path / "run"
    proc = run_here(
        ["--engine", engine, "--trainer", "Vanilla", "--root", layouts_root, "--output-dir", str(out),
         "--dataset-config-file", os.path.join(ROOT, "configs/datasets/dg/cifar10_c.yaml"),
         "--config-file", os.path.join(ROOT, "configs/trainers/dg/vanilla/cifar10_c.yaml"),
         "--source-domains", "cifar10", "--target-domains", "cifar10_c", "--", "DATASET.CIFAR_C_LEVEL", "3"]
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "missing domain folder" in proc.stderr.strip().splitlines()[-1] and not out.exists()


def test_digit_single_takes_the_first_10000_of_each_folder(digit5_root, tmp_path):
    """Dassl's DigitSingle on Digit-5's folders: no draw, the listing's first 10,000 training
    images of a capped domain (USPS's all, once), validation on the sources' test folders, test on
    the targets'; a training folder of fewer images is one line (Dassl would train on them)."""
    from dael_plugin.data.dassl_formats import DIGIT_SINGLE_CAP

    s = load_splits("DigitSingle", digit5_root, ["mnist", "usps"], ["svhn"])

    listing = functools.partial(_digit5_listing, digit5_root)

    assert [i.impath for i in s["train_x"]] == listing("mnist", "train")[:DIGIT_SINGLE_CAP] + listing("usps", "train")
    assert [i.domain for i in s["train_x"]][DIGIT_SINGLE_CAP - 1 : DIGIT_SINGLE_CAP + 1] == [0, 1]
    assert [i.impath for i in s["val"]] == listing("mnist", "test") + listing("usps", "test")
    assert [i.impath for i in s["test"]] == listing("svhn", "test") and s["train_u"] is None
    assert all(i.label == int(i.impath[-5]) and i.classname == str(i.label) for i in s["test"])
    small = tmp_path / "digit5" / "mnist" / "train_images"
    small.mkdir(parents=True)
    for k in range(12):
        os.link(listing("mnist", "train")[k], small / os.path.basename(listing("mnist", "train")[k]))
    with pytest.raises(DAELConfigError, match="holds 12 images; DigitSingle trains on its first 10,000"):
        load_splits("DigitSingle", str(tmp_path), ["mnist"], ["mnist"])


def test_digit5_subsamples_as_dassl_describes(digit5_root):
    """Dassl's Digit-5 protocol, by hand: the capped domains give exactly 25,000 / 9,000 distinct
    images, drawn by random.sample from the folder listing with one RNG seeded by SEED, in the
    order sources' train, target's train, target's test; USPS's train list is repeated 3 times;
    labels and class names from the file name."""
    sources, targets = ["svhn", "usps"], ["mnist"]
    s = load_splits("Digit5", digit5_root, sources, targets, seed=7)
    by = {d: [i for i in s["train_x"] if i.domain == d] for d in (0, 1)}
    assert len(by[0]) == DIGIT5_CAPS["train"] and len({i.impath for i in by[0]}) == DIGIT5_CAPS["train"]
    n_usps = layouts.DIGIT5_SMALL["usps"][0]
    assert len(by[1]) == 3 * n_usps and by[1][:n_usps] == by[1][n_usps : 2 * n_usps]
    assert len(s["train_u"]) == DIGIT5_CAPS["train"] and len(s["test"]) == DIGIT5_CAPS["test"]
    assert all(i.label == int(i.impath[-5]) and i.classname == str(i.label) for i in s["test"])
    assert s["classnames"] == [str(k) for k in range(10)]

    rng = random.Random(7)

    listing = functools.partial(_digit5_listing, digit5_root)

    assert [i.impath for i in by[0]] == rng.sample(listing("svhn", "train"), DIGIT5_CAPS["train"])
    assert [i.impath for i in s["train_u"]] == rng.sample(listing("mnist", "train"), DIGIT5_CAPS["train"])
    assert [i.impath for i in s["test"]] == rng.sample(listing("mnist", "test"), DIGIT5_CAPS["test"])
    again = load_splits("Digit5", digit5_root, sources, targets, seed=7)
    other = load_splits("Digit5", digit5_root, sources, targets, seed=8)
    assert _tuples(again["test"]) == _tuples(s["test"]) and _tuples(other["test"]) != _tuples(s["test"])


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return str(dst)


def _one_line(fn):
    with pytest.raises(DAELConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_or_partial_data_is_one_line(layouts_root, tmp_path):
    """Each says what was expected, what was found, and where the data comes from."""
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    msg = _one_line(lambda: load_splits("PACS", empty, ["photo"], ["sketch"]))
    assert f"{empty}/pacs not found" in msg and "DATASETS.md#pacs" in msg and "splits/<domain>_" in msg

    root = _copy(layouts_root, tmp_path / "r")
    os.remove(os.path.join(root, "domainnet", "splits", "real_test.txt"))
    msg = _one_line(lambda: load_splits("DomainNet", root, ["clipart", "real"], ["sketch"]))
    assert "missing split file" in msg and "real_test.txt" in msg and "clipart_test.txt" in msg  # what is there
    assert "DATASETS.md#domainnet" in msg

    for k in range(2):
        os.remove(os.path.join(root, "domainnet", "sketch", "dog", f"sketch_test_00{k}.jpg"))
    msg = _one_line(lambda: load_splits("miniDomainNet", root, ["clipart"], ["sketch"]))
    assert "sketch_test.txt names 2 of 6 images that do not exist" in msg
    assert "sketch/dog/sketch_test_000.jpg" in msg and "#minidomainnet" in msg

    with open(os.path.join(root, "pacs", "splits", "photo_train_kfold.txt"), "a") as f:
        f.write("photo/dog/x.png\n")
    msg = _one_line(lambda: load_splits("PACS", root, ["photo"], ["sketch"]))
    assert "photo_train_kfold.txt:7: expected '<image path> <label>'" in msg

    shutil.rmtree(os.path.join(root, "office31", "webcam", "House"))  # Dassl would shift no label here...
    shutil.rmtree(os.path.join(root, "office31", "webcam", "Dog"))  # ...but would here: Giraffe becomes 0
    msg = _one_line(lambda: load_splits("Office31", root, ["amazon", "webcam"], ["dslr"]))
    assert "class folders differ" in msg and "missing ['Dog', 'House']" in msg and "webcam" in msg

    cart = os.path.join(root, "pacs", "splits", "cartoon_train_kfold.txt")
    os.remove(cart)
    os.mkfifo(cart)  # would block a reader that opened it
    msg = _one_line(lambda: load_splits("PACS", root, ["cartoon"], ["sketch"]))
    assert "cartoon_train_kfold.txt is not a regular file" in msg
    os.remove(cart)
    with open(cart, "wb") as f:
        f.write(b"\xff\xfe\x00binary")
    msg = _one_line(lambda: load_splits("PACS", root, ["cartoon"], ["sketch"]))
    assert "cannot read split file" in msg and "UnicodeDecodeError" in msg

    os.rename(os.path.join(root, "VLCS", "SUN", "test"), os.path.join(root, "VLCS", "SUN", "tests"))
    msg = _one_line(lambda: load_splits("VLCS", root, ["caltech"], ["sun"]))
    assert "missing domain folder" in msg and "SUN/test" in msg and "'tests'" in msg and "#vlcs" in msg


def test_a_partial_digit5_is_one_line(tmp_path):
    layouts.digit5(str(tmp_path), domains=("usps", "syn"))
    folder = tmp_path / "digit5" / "syn" / "train_images"
    for name in sorted(os.listdir(folder))[:8]:
        os.remove(folder / name)
    msg = _one_line(lambda: load_splits("Digit5", str(tmp_path), ["syn"], ["usps"]))
    assert f"{folder} holds 24,999 images; Digit-5's protocol samples 25,000" in msg and "#digit-5" in msg
    (folder / "readme.txt").write_text("x")
    msg = _one_line(lambda: load_splits("Digit5", str(tmp_path), ["syn"], ["usps"]))
    assert "readme.txt: Digit-5 file names are <id>_<label>.<ext>" in msg
    msg = _one_line(lambda: load_splits("Digit5", str(tmp_path), ["svhn"], ["usps"]))
    assert "missing image folder" in msg and "svhn/train_images" in msg


# -- Dassl's digit backbones ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cnn_digit5_m3sda", "cnn_digitsdg", "cnn_digitsingle"])
def test_dassl_digit_backbones_without_dassl(name):
    """The architecture by hand: feature size and parameter count (m3sda: convs 4,864 + 102,464 +
    204,928, FCs 25,168,896 + 6,293,504, BNs 10,752; digitsdg: 1,792 + 3 x 36,928; digitsingle:
    4,864 + 204,928, FCs 3,277,824 + 1,049,600), 32x32 only."""
    from dael_plugin.backbones import build_backbone

    net = build_backbone(name).eval()
    out = net(torch.randn(2, 3, 32, 32))
    want = {
        "cnn_digit5_m3sda": (2048, 31_785_408),
        "cnn_digitsdg": (256, 112_576),
        "cnn_digitsingle": (1024, 4_537_216),
    }
    want = want[name]
    assert out.shape == (2, net.out_features) and net.out_features == want[0]
    assert sum(p.numel() for p in net.parameters()) == want[1]
    msg = _one_line(lambda: net(torch.randn(2, 3, 28, 28)))
    assert "32x32" in msg and "INPUT.SIZE" in msg


def test_dassls_wide_resnets_without_dassl():
    """WRN-28-2 (64 x 2 = 128 features, the 1.47M parameters of the SSL literature's 1.5M) and
    WRN-16-4 (256 features), any input size; in training the same input twice gives the same
    features (no dropout: Dassl builds them with dropRate 0)."""
    from dael_plugin.backbones import build_backbone

    for name, features, params in (("wide_resnet_28_2", 128, 1_466_320), ("wide_resnet_16_4", 256, 2_746_320)):
        net = build_backbone(name).train()
        x = torch.randn(2, 3, 40, 40)
        assert net(x).shape == (2, features) and sum(p.numel() for p in net.parameters()) == params
        assert torch.equal(net(x), net(x))


def test_dassls_imagenet_and_preact_backbones_without_dassl(tmp_path, monkeypatch):
    """alexnet and vgg16 (torchvision's, without the last layer: 61,100,840 - 4,097,000 and
    138,357,544 - 4,097,000 parameters, 4096 features) and preact_resnet18 (11,166,016, 512
    features, 32x32 only: Dassl's 4x4 pool). PRETRAINED reads the ImageNet file Dassl reads from the
    torch hub cache, every key of the backbone (the file's last layer left out), and the record
    names it; a cache without it, offline, is one line (never a random start that looks pretrained)."""
    from dael_plugin.backbones import build_backbone
    from dael_plugin.backbones.record import weights_record
    from dael_plugin.backbones.timm_backbone import host_resolves

    for name, size, features, params in (
        ("alexnet", 64, 4096, 57_003_840),
        ("vgg16", 64, 4096, 134_260_544),
        ("preact_resnet18", 32, 512, 11_166_016),
    ):
        net = build_backbone(name).eval()
        assert net(torch.randn(2, 3, size, size)).shape == (2, features) == (2, net.out_features)
        assert sum(p.numel() for p in net.parameters()) == params, name
    assert "32x32" in _one_line(lambda: build_backbone("preact_resnet18")(torch.randn(1, 3, 64, 64)))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    if not host_resolves("https://download.pytorch.org"):
        msg = _one_line(lambda: build_backbone("alexnet", pretrained=True))
        assert "alexnet-owt-4df8aa71.pth) are not in the torch hub cache" in msg and "PRETRAINED False" in msg
    from torchvision.models import alexnet

    torch.manual_seed(5)
    imagenet = alexnet(weights=None).state_dict()  # the file's layout: torchvision's whole AlexNet
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(imagenet, cache / "alexnet-owt-4df8aa71.pth")
    net = build_backbone("alexnet", pretrained=True)
    assert all(torch.equal(v, imagenet[k]) for k, v in net.state_dict().items())
    record = weights_record("alexnet", True, "", "builtin")
    assert record["source"] == "cache" and record["file"].endswith("alexnet-owt-4df8aa71.pth")
    assert weights_record("alexnet", False, "", "builtin")["read"] is None


DASSL_BACKBONES = ["cnn_digit5_m3sda", "cnn_digitsdg", "cnn_digitsingle", "wide_resnet_28_2", "wide_resnet_16_4"]


@pytest.mark.dassl
@pytest.mark.parametrize("name", DASSL_BACKBONES + ["preact_resnet18", "alexnet", "vgg16"])
def test_dassl_digit_backbones_equal_dassls(name):
    """Key for key the same state dict (names, shapes, buffers); the same initial weights from the
    same seed; the same outputs, in training (dropout from the same RNG) and in evaluation; and
    a state dict saved by one loads strictly into the other. alexnet and vgg16 at 64x64, without
    their ImageNet weights (Dassl's random start; vgg16 initialises it, as Dassl does then)."""
    from dassl.modeling import build_backbone as dassl_build

    from dael_plugin.backbones import build_backbone

    imagenet = name in ("alexnet", "vgg16")
    torch.manual_seed(3)
    ref = dassl_build(name, verbose=False, **({"pretrained": False} if imagenet else {}))
    torch.manual_seed(3)
    ours = build_backbone(name)
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b) and all(a[k].shape == b[k].shape for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a), "initialisation differs"
    x = torch.randn(4, 3, 64, 64) if imagenet else torch.randn(4, 3, 32, 32)
    for train in (True, False):
        ref.train(train), ours.train(train)
        torch.manual_seed(11)
        ya = ref(x)
        torch.manual_seed(11)
        yb = ours(x)
        assert torch.equal(ya, yb), train
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)


@pytest.mark.dassl
def test_dassls_own_pretrained_backbone_offline_is_the_built_in_engines_line(tmp_path, monkeypatch):
    """The Dassl engine's check of Dassl's own pretrained resnet18 offline and the built-in engine's
    alexnet say the one line (backbones.dassl_cnns.weights_unreachable), each with its own fix."""
    from dael_plugin.backbones import build_backbone
    from dael_plugin.backbones.record import check_dassl_pretrained_reachable
    from dael_plugin.backbones.timm_backbone import host_resolves

    if host_resolves("https://download.pytorch.org"):
        pytest.skip("download.pytorch.org can be reached here: the weights would be fetched, not refused")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = os.path.join(str(tmp_path), "hub", "checkpoints")
    dassl = _one_line(lambda: check_dassl_pretrained_reachable("resnet18"))
    ours = _one_line(lambda: build_backbone("alexnet", pretrained=True))
    for msg, file in ((dassl, "resnet18-5c106cde.pth"), (ours, "alexnet-owt-4df8aa71.pth")):
        assert msg.startswith(f"pretrained weights for Dassl's {file.split('-')[0]} ({file}) are not in the torch hub "
                              f"cache {cache} and https://download.pytorch.org/models/{file} cannot be reached; "), msg  # fmt: skip
    assert dassl.endswith("put the file there, or set MODEL.BACKBONE.PRETRAINED False")


@pytest.mark.dassl
def test_vgg16_before_its_imagenet_weights_starts_as_dassls():
    """With PRETRAINED Dassl builds vgg16 without its initialisation (the file replaces it): the
    random stream after the build, which the heads draw from next, is then Dassl's too."""
    from dassl.modeling.backbone.vgg import VGG, cfgs, make_layers

    from dael_plugin.backbones import DASSL_IMAGENET

    torch.manual_seed(3)
    ref = VGG(make_layers(cfgs["D"]), init_weights=False)
    after_ref = torch.rand(3)
    torch.manual_seed(3)
    ours = DASSL_IMAGENET["vgg16"](True)
    assert all(torch.equal(v, ours.state_dict()[k]) for k, v in ref.state_dict().items())
    assert torch.equal(torch.rand(3), after_ref)


MIXING = ["resnet18_ms_l123", "resnet18_efdmix_l12", "resnet50_ms_l1"]


def test_dassls_mixstyle_resnets_without_dassl():
    """``resnet18_ms_l123``: timm's ResNet-18 (torchvision's weights, as Dassl's ``resnet18``) with
    one MixStyle layer after stages 1-3. In evaluation, or never drawn (``p`` 0), it is the plain
    ResNet; drawn every time, each image's features are another image's style; DAEL's fused pass
    takes per-chunk calls for it."""
    import random

    from dael_plugin.backbones import build_backbone, timm_name_of
    from dael_plugin.core.chunk_norm import unfusable_reason

    net = build_backbone("resnet18_ms_l123")
    plain = build_backbone("resnet18")
    plain.load_state_dict(net.state_dict(), strict=True)  # the same keys: the mixing layer holds no weight
    assert timm_name_of("resnet18_ms_l123") == timm_name_of("resnet18") == "resnet18.tv_in1k"
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(net.eval()(x), plain.eval()(x))
    net.train(), plain.train()
    net.mixstyle.p = 0.0
    assert torch.equal(net(x), plain(x))
    net.mixstyle.p = 1.0
    random.seed(0), torch.manual_seed(0)
    assert not torch.allclose(net(x), plain(x), atol=1e-3)
    assert "MixStyle layer mixes the samples of one call" in unfusable_reason(net)
    assert "EFDMix" in unfusable_reason(build_backbone("resnet18_efdmix_l1"))
    assert "resnet{18,50,101}_{ms,efdmix}_l{1,12,123}" in _one_line(lambda: build_backbone("resnet34_ms_l123"))


@pytest.mark.dassl
@pytest.mark.parametrize("name", MIXING)
def test_dassls_mixstyle_resnets_equal_dassls(name):
    """Dassl's weights load key for key, and from the same random states (Python's, for whether a
    layer mixes; torch's, for the Beta weights and the partners) the features and the gradients are
    Dassl's bit for bit, in training (over seeds where some layers mix and some do not) and in
    evaluation."""
    import random

    from dassl.modeling import build_backbone as dassl_build

    from dael_plugin.backbones import build_backbone

    ref, ours = dassl_build(name, pretrained=False), build_backbone(name)
    ours.model.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(6, 3, 32, 32)
    mixed = 0
    for seed in range(4):
        for net in (ref, ours):
            net.train().zero_grad()
            random.seed(seed), torch.manual_seed(seed)
            net.y = net(x)
            net.y.square().sum().backward()
        assert torch.equal(ref.y, ours.y), seed
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), ours.model.parameters()))
        random.seed(seed)
        mixed += random.random() <= 0.5
    assert 0 < mixed < 4  # the first layer mixed on some seeds and not on others
    assert torch.equal(ref.eval()(x), ours.eval()(x))


# -- every shipped dataset config trains on both engines ----------------------------------------
# dataset config: (sources, target, INPUT.SIZE override); the fixture holds these domains.
SHIPPED = {
    "da/digit5": (["mnist_m", "svhn", "syn", "usps"], ["mnist"], None),
    "da/domainnet": (["clipart", "painting", "real"], ["sketch"], "(64, 64)"),
    "da/mini_domainnet": (["clipart", "painting", "real"], ["sketch"], "(64, 64)"),
    "dg/pacs": (["art_painting", "cartoon", "photo"], ["sketch"], "(64, 64)"),
    "dg/office_home_dg": (["art", "clipart", "product"], ["real_world"], "(64, 64)"),
    "dg/digits_dg": (["mnist", "mnist_m", "svhn"], ["syn"], None),
    "da/visda17": (["synthetic"], ["real"], "(64, 64)"),  # one source: SourceOnly, not DAEL
    "dg/cifar10_c": (["cifar10"], ["cifar10_c"], None),  # one source: Vanilla, not DAELDG
    "dg/cifar100_c": (["cifar100"], ["cifar100_c"], None),
    "dg/camelyon17": (["train"], ["test"], "(32, 32)"),  # WILDS: one named source of many hospitals
    "dg/fmow": (["train"], ["test"], "(32, 32)"),
    "dg/iwildcam": (["train"], ["test"], "(32, 32)"),
    "ssl/cifar10": (["labeled"], ["unlabeled"], None),  # semi-supervised: FixMatch (Dassl's cannot be built: EntMin)
    "ssl/cifar100": (["labeled"], ["unlabeled"], None),
    "ssl/svhn": (["labeled"], ["unlabeled"], None),
    "ssl/stl10": (["labeled"], ["unlabeled"], "(32, 32)"),
}
WILDS_SHIPPED = ("dg/camelyon17", "dg/fmow", "dg/iwildcam")
SSL_SHIPPED = ("ssl/cifar10", "ssl/cifar100", "ssl/svhn", "ssl/stl10")
ONE_SOURCE = ("da/visda17", "dg/cifar10_c", "dg/cifar100_c") + WILDS_SHIPPED + SSL_SHIPPED


def test_every_shipped_dataset_config_is_in_the_one_step_test():
    from conftest import ROOT

    shipped = {
        f"{s}/{os.path.splitext(f)[0]}"
        for s in ("da", "dg", "ssl")
        for f in os.listdir(os.path.join(ROOT, "configs", "datasets", s))
    }
    # the embedded ones: every other test; the category-shift one: tests/test_category_shift.py, both engines
    assert shipped - {"da/embedded_digits", "dg/embedded_digits_dg", "da/embedded_digits_cs"} == set(SHIPPED)


def _one_step(engine, dataset, root, out):
    from conftest import ROOT
    from dael_plugin.tools.sweep_plan import method_config
    from dael_plugin.tools.train import build_parser, setup_cfg
    from dael_plugin.tools.train_config import check_names_and_files as _check_names

    sources, targets, size = SHIPPED[dataset]
    setting = dataset.split("/")[0]
    many = "DAEL" if setting == "da" else "DAELDG"
    trainer = ("SourceOnly" if setting == "da" else "Vanilla") if dataset in ONE_SOURCE else many
    ds_file = os.path.join(ROOT, "configs", "datasets", f"{dataset}.yaml")
    n = len(sources)
    opts = ["MODEL.BACKBONE.PRETRAINED", "False", "DATALOADER.TRAIN_X.BATCH_SIZE", str(2 * n)]
    config = None
    if setting == "ssl":  # the fixture's labeled share; Dassl 0.6.3's FixMatch cannot be built: its EntMin
        config = method_config("FixMatch", setting, ds_file)
        trainer = "FixMatch" if engine == "builtin" else "EntMin"
        opts += [] if dataset == "ssl/stl10" else ["DATASET.NUM_LABELED", "3" if "cifar" in dataset else "6"]
    opts += ["DATALOADER.TRAIN_U.BATCH_SIZE", "2", "DATALOADER.NUM_WORKERS", "0"] + (
        ["INPUT.SIZE", size] if size else []
    )
    argv = ["--engine", engine, "--trainer", trainer, "--root", root, "--dataset-config-file", ds_file]
    argv += ["--config-file", config or method_config(trainer, setting, ds_file), "--source-domains", *sources]
    argv += ["--target-domains", *targets, "--output-dir", str(out), "--seed", "1", *opts]
    cfg = setup_cfg(build_parser().parse_args(argv), engine)
    _check_names(cfg, engine)
    if engine == "builtin":
        from dael_plugin.engine.trainer import set_random_seed
        from dael_plugin.methods import build_trainer

        set_random_seed(1)
        tr = build_trainer(cfg)
        items = {k: tr.splits[k] for k in ("train_x", "train_u", "test")}
    else:
        from dassl.engine import build_trainer
        from dassl.utils import set_random_seed

        import dael_plugin  # noqa: F401  (DAEL and DAELDG in Dassl's registry)

        set_random_seed(1)
        tr = build_trainer(cfg)  # DAEL's, or Dassl's own SourceOnly
        items = {k: getattr(tr.dm.dataset, k) for k in ("train_x", "train_u", "test")}
    batch_x = next(iter(tr.train_loader_x))
    loader_u = tr.train_loader_u if setting != "dg" else None  # Dassl's DG loader_u: unused
    batch_u = next(iter(loader_u)) if loader_u is not None else None  # (the built-in SourceOnly reads no target)
    tr.batch_idx, tr.epoch, tr.num_batches = 0, 0, len(tr.train_loader_x)  # as Dassl's run_epoch sets them
    dassl_x = engine == "dassl" and trainer == "Vanilla"  # Dassl's TrainerX: a source batch alone
    losses = tr.forward_backward(batch_x) if dassl_x else tr.forward_backward(batch_x, batch_u)
    return {k: float(v) for k, v in losses.items()}, items


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
@pytest.mark.parametrize("dataset", sorted(SHIPPED))
def test_every_shipped_dataset_config_trains_one_step(engine, dataset, shipped_root, tmp_path):
    """Each shipped dataset config with its DAEL trainer config: the trainer is built from data in
    Dassl's layout (the config's own backbone, Dassl's for digits) and one step gives finite losses.
    On Dassl, with Dassl's own readers."""
    torch.set_num_threads(1)
    if dataset in WILDS_SHIPPED:
        pytest.importorskip("wilds", reason="the WILDS readers read the wilds package's metadata: pip install wilds")
    losses, items = _one_step(engine, dataset, shipped_root, tmp_path)
    assert losses and all(v == v and abs(v) < 1e4 for v in losses.values()), losses
    if dataset not in ONE_SOURCE:
        assert "loss_x" in losses and ("loss_u" in losses) == dataset.startswith("da/")
    held = len({i.domain for i in items["train_x"]})  # a WILDS source: its metadata's domains (Dassl's numbers)
    assert held > 1 if dataset in WILDS_SHIPPED else held == len(SHIPPED[dataset][0])


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_partial_dataset_is_one_line_from_the_train_script_and_leaves_nothing(engine, layouts_root, tmp_path, capsys):
    """On Dassl too the plugin's reader goes first: Dassl's PACS reader would raise a bare
    FileNotFoundError here, and its Office31 reader would shift labels without a word."""
    from conftest import ROOT
    from test_hardening import cli, one_error_line

    root = _copy(layouts_root, tmp_path / "r")
    os.remove(os.path.join(root, "pacs", "splits", "cartoon_crossval_kfold.txt"))
    out = tmp_path / "out"
    argv = ["--engine", engine, "--trainer", "DAELDG", "--root", root, "--output-dir", str(out)]
    argv += ["--dataset-config-file", os.path.join(ROOT, "configs/datasets/dg/pacs.yaml")]
    argv += ["--config-file", os.path.join(ROOT, "configs/trainers/dg/daeldg/pacs.yaml")]
    argv += ["--source-domains", "photo", "cartoon", "--target-domains", "sketch", "--"]
    code, _, err = cli(argv + ["MODEL.BACKBONE.PRETRAINED", "False"], capsys)
    line = one_error_line(err)
    assert code == 2 and "missing split file" in line and "cartoon_crossval_kfold.txt" in line, err
    assert not out.exists()


def test_entries_that_are_not_regular_files_are_found_by_folder(tmp_path):
    """``not_regular_files``: one scandir per folder, links followed, order kept."""
    from dael_plugin.data.images import not_regular_files

    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.png").write_bytes(b"x")
    os.mkfifo(d / "fifo.png")
    (d / "zero.png").symlink_to("/dev/zero")
    (d / "dir.png").mkdir()
    (d / "link.png").symlink_to(d / "ok.png")
    (d / "broken.png").symlink_to(d / "nowhere.png")
    names = ["ok.png", "fifo.png", "zero.png", "dir.png", "link.png", "broken.png", "missing.png"]
    paths = [str(d / n) for n in names]
    assert not_regular_files(paths) == [
        str(d / n) for n in ("fifo.png", "zero.png", "dir.png", "broken.png", "missing.png")
    ]


@pytest.mark.dassl
def test_a_fifo_in_dassls_own_dataset_is_one_line_before_the_output_folder(layouts_root, tmp_path, capsys):
    """Dassl's ``Datum`` asserts ``os.path.isfile``: its PACS reader would stop on a FIFO named like
    an image with a bare AssertionError. The plugin's reader goes first and says it in one line."""
    from conftest import ROOT
    from test_hardening import cli, one_error_line

    root = _copy(layouts_root, tmp_path / "r")
    image = os.path.join(root, "pacs", "images", "cartoon", "dog", "train_0.png")
    os.remove(image)
    os.mkfifo(image)
    out = tmp_path / "out"
    argv = ["--engine", "dassl", "--trainer", "DAELDG", "--root", root, "--output-dir", str(out)]
    argv += ["--dataset-config-file", os.path.join(ROOT, "configs/datasets/dg/pacs.yaml")]
    argv += ["--config-file", os.path.join(ROOT, "configs/trainers/dg/daeldg/pacs.yaml")]
    argv += ["--source-domains", "photo", "cartoon", "--target-domains", "sketch", "--"]
    code, _, err = cli(argv + ["MODEL.BACKBONE.PRETRAINED", "False"], capsys)
    line = one_error_line(err)
    assert code == 2 and "1 of the PACS images are not regular files" in line and image in line, err
    assert "--engine builtin" in line and not out.exists()


# -- category shift (DATASET.CATEGORY_SHIFT): a source domain lacks a class ----------------------
def _strip_a_class(name, root):
    """Take class ``dog`` (label 0: every later label of a per-domain numbering would shift) out of
    one source domain of ``name`` under ``root``, as its format lays it out. Returns (domain index
    among RUNS' sources, label)."""

    def drop_lines(path):
        lines = open(path).read().splitlines()
        with open(path, "w") as f:
            f.write("".join(x + "\n" for x in lines if "/dog/" not in x))

    if name in ("DomainNet", "miniDomainNet"):
        for folder in ("splits", "splits_mini"):
            for split in ("train", "test"):
                drop_lines(os.path.join(root, "domainnet", folder, f"painting_{split}.txt"))
        return 1, 0
    if name == "PACS":
        for split in ("train", "crossval"):
            drop_lines(os.path.join(root, "pacs", "splits", f"cartoon_{split}_kfold.txt"))
        return 1, 0
    if name in ("Office31", "OfficeHome"):
        shutil.rmtree(
            os.path.join(root, {"Office31": "office31/webcam", "OfficeHome": "office_home/clipart"}[name], "Dog")
        )
        return 1, 0
    if name == "VLCS":
        for split in ("train", "crossval", "test"):
            shutil.rmtree(os.path.join(root, "VLCS", "LABELME", split, "dog"))
        return 1, 0
    for split in ("train", "test"):  # Digit5: usps (uncapped) loses digit 5
        folder = os.path.join(root, "digit5", "usps", f"{split}_images")
        for f in os.listdir(folder):
            if f.endswith("_5.png"):
                os.remove(os.path.join(folder, f))
    return 3, 5


def _make_layout(name, root):
    if name == "Digit5":
        layouts.digit5(root)
    elif name in ("DomainNet", "miniDomainNet"):
        layouts.domainnet(root)
    elif name == "PACS":
        layouts.pacs(root)
    elif name == "VLCS":
        layouts.vlcs(root)
    else:
        layouts.office(root, {"Office31": "office31", "OfficeHome": "office_home"}[name], layouts_domains(name))
    return root


def layouts_domains(name):
    from dael_plugin.data.folders import DATASETS

    return DATASETS[name].domains


@pytest.fixture(scope="module")
def shifted_roots(tmp_path_factory, layouts_root):
    """name -> (root with one source lacking a class, the stripped (domain, label)); Digit-5's is
    made in its test, at small caps."""
    out = {}
    for name in sorted(set(RUNS) - {"Digit5"}):
        root = _make_layout(name, str(tmp_path_factory.mktemp(f"shift_{name}")))
        out[name] = (root, _strip_a_class(name, root))
    return out


# Digit-5 for the category-shift case, small: the layout holds caps + 7 images per folder (20 and 10),
# and the reader's caps then take them all, so that every domain keeps every digit (34k files are not needed)
SMALL_CAPS, ALL_OF_THEM = {"train": 13, "test": 3}, {"train": 20, "test": 10}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_dassl_format_reads_a_category_shift_as_the_union(name, request, tmp_path, monkeypatch):
    """A source domain without one class: refused in one line that names DATASET.CATEGORY_SHIFT;
    with the key, the items are those of the complete set less the class's, with the complete
    set's labels (the union), and the class table shows the gap."""
    from dael_plugin.data import dassl_formats
    from dael_plugin.data.classes import classes_by_domain

    if name == "Digit5":
        monkeypatch.setattr(dassl_formats, "DIGIT5_CAPS", SMALL_CAPS)  # what the layout makes
        full_root = _make_layout(name, str(tmp_path / "full"))
        root = _make_layout(name, str(tmp_path / "shifted"))
        dom, label = _strip_a_class(name, root)
        monkeypatch.setattr(dassl_formats, "DIGIT5_CAPS", ALL_OF_THEM)  # what the reader draws
    else:
        root, (dom, label) = request.getfixturevalue("shifted_roots")[name]
        full_root = request.getfixturevalue("layouts_root")
    sources, targets = RUNS[name]
    with pytest.raises(DAELConfigError, match="DATASET.CATEGORY_SHIFT True") as exc:
        load_splits(name, root, sources, targets, seed=5)
    assert "\n" not in str(exc.value)
    got = load_splits(name, root, sources, targets, seed=5, category_shift=True)
    full = load_splits(name, full_root, sources, targets, seed=5)
    assert got["classnames"] == full["classnames"]
    rel = lambda r, items: [(os.path.relpath(i.impath, r), i.label, i.domain, i.classname) for i in items]  # noqa: E731
    full_x = rel(full_root, full["train_x"])
    want = [t for t in full_x if not (t[2] == dom and t[1] == label)]
    if name == "Digit5":  # the capped domains are a seeded subsample of the folder: compare usps alone
        full_x, want = [t for t in full_x if t[2] == dom], [t for t in want if t[2] == dom]
        assert [t for t in rel(root, got["train_x"]) if t[2] == dom] == want
    else:
        assert rel(root, got["train_x"]) == want
    assert len(want) < len(full_x)
    held = classes_by_domain(got["train_x"], len(sources), len(got["classnames"]))
    assert [r[label] for r in held] == [d != dom for d in range(len(sources))]
    assert all(i.label == got["classnames"].index(i.classname) for i in got["train_x"] + got["test"])


@pytest.mark.dassl
@pytest.mark.parametrize("name", ["Office31", "PACS", "VLCS", "DomainNet"])
def test_dassls_registry_reads_a_category_shift_through_the_plugin(name, shifted_roots):
    """On the Dassl engine, Dassl's dataset class of ``name`` reads through the plugin's reader
    under DATASET.CATEGORY_SHIFT (Dassl's own reader numbers each domain's class folders on its
    own: the domain without ``dog`` would call ``giraffe`` 0), and is Dassl's own without it."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import DATASET_REGISTRY

    import dael_plugin.dassl_adapter  # noqa: F401  (registers)
    from dael_plugin.config.keys import add_dael_config

    root, (dom, label) = shifted_roots[name]
    sources, targets = RUNS[name]
    cfg = add_dael_config(get_cfg_default())
    cfg.DATASET.ROOT, cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS = root, sources, targets
    cfg.SEED = 5
    cls = DATASET_REGISTRY.get(name)
    cfg.DATASET.CATEGORY_SHIFT = True
    ours = load_splits(name, root, sources, targets, seed=5, category_shift=True)
    ds = cls(cfg)
    for split in ("train_x", "train_u", "val", "test"):
        assert _tuples(getattr(ds, split) or None) == _tuples(ours[split]), split
    assert ds.num_classes == 3 and ds.lab2cname == dict(enumerate(ours["classnames"]))
    cfg.DATASET.CATEGORY_SHIFT = False
    dassls = cls._dael_dassl_reader(cfg)
    assert _tuples(cls(cfg).train_x) == _tuples(dassls.train_x)
    if name in ("Office31", "VLCS"):  # why the plugin reads: Dassl's labels shift in that domain
        shifted = {(d.classname or d.impath.split("/")[-2], d.label) for d in dassls.train_x if d.domain == dom}
        assert ("giraffe" if name == "VLCS" else "Giraffe", 0) in shifted


def test_edited_split_files_are_one_line_naming_the_file_and_line(layouts_root, tmp_path):
    """The probe's split files: a blank line between entries (Dassl's reader failed on it with a
    traceback, the plugin's check let it through), a PACS label below 1 ("labels [-1] have no
    image", no file), and a label edited to another class's number (read as category shift, or
    under CATEGORY_SHIFT an extra class with a name already taken)."""
    root = _copy(layouts_root, tmp_path / "r")
    photo = os.path.join(root, "pacs", "splits", "photo_train_kfold.txt")
    lines = open(photo).read().splitlines()
    open(photo, "w").write("\n".join(lines[:2] + [""] + lines[2:]) + "\n\n")
    msg = _one_line(lambda: load_splits("PACS", root, ["photo"], ["sketch"]))
    assert "photo_train_kfold.txt:3: a blank line between entries" in msg
    open(photo, "w").write("\n".join(lines) + "\n\n\n")  # blank lines at the end: nothing is lost, read
    assert load_splits("PACS", root, ["photo"], ["sketch"])["train_x"]
    rel, label = lines[1].split(" ")
    open(photo, "w").write("\n".join(lines[:1] + [f"{rel} 0"] + lines[2:]) + "\n")
    msg = _one_line(lambda: load_splits("PACS", root, ["photo"], ["sketch"]))
    assert f"photo_train_kfold.txt:2: label 0 of '{rel}' is below 1" in msg
    other = str(int(label) % len(lines) + 1 if int(label) < 3 else 1)  # another class's number
    open(photo, "w").write("\n".join(lines[:1] + [f"{rel} {other}"] + lines[2:]) + "\n")
    for shift in (False, True):
        msg = _one_line(lambda: load_splits("PACS", root, ["photo"], ["sketch"], category_shift=shift))
        assert f"class {rel.split('/')[1]!r} has label" in msg and rel in msg and "one label per class" in msg
