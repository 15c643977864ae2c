"""Tiny datasets in each of Dassl's on-disk formats (see dael_plugin/data/dassl_formats.py).

Images are 32x32, coloured by class, so a training step sees different classes. Split files
list their lines out of sorted order, so a reader that sorted them would be caught.
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence

from PIL import Image

CLASSES = ("giraffe", "dog", "house")  # deliberately not sorted


def _image(path: str, label: int, k: int = 0) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (32, 32), (40 + 90 * label, 10 * k % 255, 200 - 60 * label)).save(path)


def _write_lines(path: str, lines: Sequence[str]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))


def domainnet(root: str, domains=("clipart", "painting", "real", "sketch"), per_class: int = 3) -> Dict[str, List[str]]:
    """``domainnet/<domain>/<class>/<image>.jpg`` with ``splits/`` and ``splits_mini/`` (the same
    lists), labels by sorted class name as in DomainNet. Returns the split files' lines."""
    labels = {c: i for i, c in enumerate(sorted(CLASSES))}
    out = {}
    for d in domains:
        for split, n in (("train", per_class), ("test", 2)):
            lines = []
            for c in reversed(CLASSES):
                for k in range(n):
                    rel = f"{d}/{c}/{d}_{split}_{k:03d}.jpg"
                    _image(os.path.join(root, "domainnet", rel), labels[c], k)
                    lines.append(f"{rel} {labels[c]}")
            for folder in ("splits", "splits_mini"):
                _write_lines(os.path.join(root, "domainnet", folder, f"{d}_{split}.txt"), lines)
            out[f"{d}_{split}"] = lines
    return out


def office(root: str, dataset_dir: str, domains: Sequence[str], per_class: int = 3) -> None:
    """``<dataset_dir>/<domain>/<Class>/<image>.jpg`` (Office-31, Office-Home)."""
    for d in domains:
        for label, c in enumerate(sorted(CLASSES)):
            for k in range(per_class):
                _image(os.path.join(root, dataset_dir, d, c.capitalize(), f"img_{k:03d}.jpg"), label, k)


def pacs(root: str, domains=("art_painting", "cartoon", "photo", "sketch"), per_class: int = 2) -> None:
    """``pacs/images/<domain>/<class>/`` and ``splits/<domain>_{train,crossval}_kfold.txt`` with
    1-indexed labels; sketch's list names Dassl's one broken image, which is absent."""
    labels = {c: i for i, c in enumerate(sorted(CLASSES))}
    for d in domains:
        for split in ("train", "crossval"):
            lines = []
            for c in reversed(CLASSES):
                for k in range(per_class):
                    rel = f"{d}/{c}/{split}_{k}.png"
                    _image(os.path.join(root, "pacs", "images", rel), labels[c], k)
                    lines.append(f"{rel} {labels[c] + 1}")
            if d == "sketch" and split == "train":
                lines.insert(1, "sketch/dog/n02103406_4068-1.png 2")
            _write_lines(os.path.join(root, "pacs", "splits", f"{d}_{split}_kfold.txt"), lines)
    # the split Dassl reads for nothing (PACS's own test lists) is left out: neither reader opens it


def vlcs(root: str, domains=("caltech", "labelme", "pascal", "sun"), per_class: int = 2) -> None:
    """``VLCS/<DOMAIN>/{train,crossval,test}/<class>/*.jpg``, plus a non-jpg file both readers skip."""
    for d in domains:
        for split in ("train", "crossval", "test"):
            for label, c in enumerate(sorted(CLASSES)):
                for k in range(per_class):
                    _image(os.path.join(root, "VLCS", d.upper(), split, c, f"{k}.jpg"), label, k)
                open(os.path.join(root, "VLCS", d.upper(), split, c, "notes.txt"), "w").close()


def digits_dg(root: str, dataset_dir: str, domains: Sequence[str], splits=("train", "val"), per_class: int = 3) -> None:
    """``<dataset_dir>/<domain>/<split>/<class>/<image>`` (Digits-DG, Office-Home-DG)."""
    for d in domains:
        for split in splits:
            for label, c in enumerate(sorted(CLASSES)):
                for k in range(per_class):
                    _image(os.path.join(root, dataset_dir, d, split, c, f"{k}.jpg"), label, k)


DIGIT5_SMALL = {"usps": (12, 6)}  # images per split of the uncapped domain


def digit5(root: str, domains=("mnist", "mnist_m", "svhn", "syn", "usps")) -> None:
    """``digit5/<domain>/{train,test}_images/<id>_<label>.png``. The capped domains hold exactly
    Dassl's caps plus a few (hard links to one image per label: 34k files in about a second)."""
    from dael_plugin.data.dassl_formats import DIGIT5_CAPS

    base = os.path.join(root, "digit5", ".images")
    for label in range(10):
        _image(os.path.join(base, f"{label}.png"), label % 3, label)
    for d in domains:
        for split in ("train", "test"):
            folder = os.path.join(root, "digit5", d, f"{split}_images")
            os.makedirs(folder, exist_ok=True)
            n = DIGIT5_SMALL[d][split == "test"] if d in DIGIT5_SMALL else DIGIT5_CAPS[split] + 7
            for i in range(n):
                os.link(os.path.join(base, f"{i % 10}.png"), os.path.join(folder, f"{i:05d}_{i % 10}.png"))


def visda17(root: str, per_class: int = 2) -> None:
    """``visda17/{train,validation}/<class>/<image>`` with each folder's ``image_list.txt`` of
    ``<class>/<image> <label>`` lines (labels by sorted class name, lines out of that order)."""
    labels = {c: i for i, c in enumerate(sorted(CLASSES))}
    for folder in ("train", "validation"):
        lines = []
        for c in reversed(CLASSES):
            for k in range(per_class):
                rel = f"{c}/{folder}_{k:03d}.png"
                _image(os.path.join(root, "visda17", folder, rel), labels[c], k)
                lines.append(f"{rel} {labels[c]}")
        _write_lines(os.path.join(root, "visda17", folder, "image_list.txt"), lines)


def cifar_stl(root: str, per_class: int = 2) -> None:
    """``cifar_stl/<domain>/{train,test}/<NNN>_<class>/<image>``, as Dassl's ``cifar_stl.py`` writes it."""
    for d in ("cifar", "stl"):
        for split in ("train", "test"):
            for label, c in enumerate(CLASSES):
                for k in range(per_class):
                    _image(os.path.join(root, "cifar_stl", d, split, f"{label:03d}_{c}", f"{k + 1:05d}.jpg"), label, k)


def cifar_c(root: str, clean: str = "cifar10", per_class: int = 2, corruptions=(("fog", 5), ("snow", 1))) -> None:
    """``<clean>/train/<class>/<image>`` and ``<clean>_c/<type>/<level>/<class>/<image>``, as Dassl's
    ``cifar_c.py`` and CIFAR script lay them out (under --root itself); the corrupted copies differ
    in their colour, so a reader of the wrong folder would be caught."""
    for label, c in enumerate(CLASSES):
        for k in range(per_class):
            _image(os.path.join(root, clean, "train", c, f"{k:05d}.png"), label, k)
            for n, (kind, level) in enumerate(corruptions, 1):
                _image(os.path.join(root, f"{clean}_c", kind, str(level), c, f"{k:05d}.png"), label, k + 7 * n)


def ssl(root: str, per_class: int = 6) -> None:
    """Dassl's semi-supervised sets as its scripts write them: ``svhn/{train,test}/<NNN>/<NNNNN>.jpg``;
    ``test/`` beside :func:`cifar_c`'s ``cifar10/train`` and ``cifar100/train``; and
    ``stl10/{train,test,unlabeled}/<NNNNNN>_<label|none>.jpg`` with ``stl10_binary/fold_indices.txt``
    (fold 0 lists images out of order, fold 1 one past 255, which Dassl's uint8 parse wraps)."""
    for label in range(3):
        for k in range(per_class):
            _image(
                os.path.join(root, "svhn", "train", f"{label:03d}", f"{label * per_class + k + 1:05d}.jpg"), label, k
            )
        for k in range(2):
            _image(os.path.join(root, "svhn", "test", f"{label:03d}", f"{k + 1:05d}.jpg"), label, k)
        for clean in ("cifar10", "cifar100"):
            _image(os.path.join(root, clean, "test", CLASSES[label], f"{k:05d}.png"), label, 3)
    for split, n in (("train", 9), ("test", 4), ("unlabeled", 5)):
        for i in range(n):
            label = "none" if split == "unlabeled" else str(i % 3)
            _image(os.path.join(root, "stl10", split, f"{i:06d}_{label}.jpg"), i % 3, i)
    _write_lines(os.path.join(root, "stl10", "stl10_binary", "fold_indices.txt"), ["7 2 4 0 5 1", "3 260"])


def _csv(path: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    _write_lines(path, [",".join(header)] + [",".join(str(v) for v in row) for row in rows])


def wilds(root: str) -> None:
    """Camelyon17, FMoW and IWildCam in the WILDS release layout (``<name>_v<version>/`` with its
    release file and metadata), a few images each. The training split's metadata domains are
    numbered so that a Python set of them is not in sorted order ({1, 8, 9} iterates 8, 1, 9), as
    Dassl's renumbering takes them; a reader that sorted them would be caught."""
    # Camelyon17: hospitals 0, 3, 4 train (WILDS's split 0; split 1 is the in-distribution val),
    # hospital 1 the OOD val, hospital 2 the test; labels from the tumor column
    folder = os.path.join(root, "camelyon17_v1.0")
    _write_lines(os.path.join(folder, "RELEASE_v1.0.txt"), ["v1.0"])
    rows, i = [], 0
    for center in (4, 0, 3, 1, 2):
        for slide in (10 * center, 10 * center + 1):
            patient, node = f"{slide:03d}", slide % 5
            for k in range(3):
                x, y, tumor = 100 + k, 200 + 2 * k, (k + center) % 2
                rel = f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png"
                _image(os.path.join(folder, rel), tumor, k + center)
                rows.append([i, patient, node, x, y, tumor, slide, center, int(k == 2)])
                i += 1
    header = ["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"]
    _csv(os.path.join(folder, "metadata.csv"), header, rows)
    # FMoW: domain = region * 16 + (year - 2002); train before 2013, OOD val 2013-2015, test from 2016;
    # a 'seq' row is left out of every split (its image index still counts)
    folder = os.path.join(root, "fmow_v1.1")
    _write_lines(os.path.join(folder, "RELEASE_v1.1.txt"), ["v1.1"])
    _csv(os.path.join(folder, "country_code_mapping.csv"), ["alpha-3", "region"], [["AAA", "Asia"], ["BBB", "Europe"]])
    plan = [("train", "AAA", 2003), ("train", "BBB", 2010), ("seq", "AAA", 2004), ("train", "AAA", 2010)]
    plan += [("train", "BBB", 2011), ("train", "AAA", 2003), ("val", "BBB", 2014), ("val", "AAA", 2013)]
    plan += [("test", "AAA", 2016), ("test", "BBB", 2017), ("test", "CCC", 2016), ("train", "CCC", 2005)]
    rows = []
    for i, (split, country, year) in enumerate(plan):
        category = ("airport", "zoo", "dam")[i % 3]
        rows.append([split, category, country, f"{year}-0{1 + i % 9}-15T10:00:00Z"])
        _image(os.path.join(folder, "images", f"rgb_img_{i}.png"), i % 3, i)
    _csv(os.path.join(folder, "rgb_metadata.csv"), ["split", "category", "country_code", "timestamp"], rows)
    # IWildCam: train cameras 1, 8, 9; every label, camera and sequence number is used somewhere
    folder = os.path.join(root, "iwildcam_v2.0")
    _write_lines(os.path.join(folder, "RELEASE_v2.0.txt"), ["v2.0"])
    plan = [("train", 1, 0), ("train", 8, 1), ("train", 9, 2), ("train", 1, 1), ("train", 8, 0)]
    plan += [("val", 2, 1), ("val", 3, 2), ("test", 4, 0), ("test", 5, 3), ("test", 0, 1)]
    plan += [("id_val", 6, 2), ("id_test", 7, 0)]
    rows = []
    for i, (split, location, y) in enumerate(plan):
        name = f"{i:04d}.jpg"
        _image(os.path.join(folder, "train", name), y, i)
        rows.append([split, name, y, location, i, f"2013-0{1 + i % 9}-0{1 + i % 9} 10:11:12.000"])
    header = ["split", "filename", "y", "location_remapped", "sequence_remapped", "datetime"]
    _csv(os.path.join(folder, "metadata.csv"), header, rows)
    _csv(
        os.path.join(folder, "categories.csv"),
        ["y", "category_id", "name"],
        [[k, k, n] for k, n in enumerate(CLASSES + ("empty",))],
    )
