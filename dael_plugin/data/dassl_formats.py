"""Dassl's multi-domain dataset formats, read without Dassl.

One small reader per format. Each takes exactly the files Dassl's own reader
(``dassl/data/datasets/{da,dg}``) takes and returns the same items: paths,
labels, domain indices (position in the list of domains asked for), class
names, in Dassl's order, with Dassl's quirks:

- **Digit5**: labels come from the file name (``<id>_<label>.<ext>``); MNIST,
  MNIST-M, SVHN and SYN are subsampled to 25,000 training and 9,000 test
  images with Python's ``random.sample`` (seeded by ``SEED``, drawn in Dassl's
  order: sources' train, target's train, target's test), in the folder's
  listing order; USPS's training list is repeated 3 times.
- **DomainNet / miniDomainNet**: ``splits/`` or ``splits_mini/`` hold
  ``<domain>_<split>.txt`` of ``<path> <label>`` lines; DomainNet validates on
  the sources' test lists.
- **Office31 / OfficeHome**: ``<domain>/<class>/<image>``, every image is in
  train_x (sources), train_u and test (target); labels by sorted class folder;
  OfficeHome lower-cases class names.
- **PACS**: ``splits/<domain>_{train,crossval}_kfold.txt`` with 1-indexed
  labels; ``crossval`` is the validation split; the target is tested on
  train + crossval; one broken sketch is skipped, as Dassl does.
- **VLCS**: ``<DOMAIN>/{train,crossval,test}/<class>/*.jpg``. Dassl leaves its
  class names empty; here they are the folder names.
- **VisDA17**: ``{train,validation}/image_list.txt``; synthetic -> real only
  (Dassl's reader ignores the domains asked for), every item domain 0.
- **CIFARSTL**: ``<domain>/{train,test}/<label>_<class>/<image>``, the label
  from the folder's number (Dassl leaves the class names empty).
- **DigitSingle**: Digit-5's folders, the listing's first 10,000 training
  images of a capped domain, no draw (Dassl leaves the class names empty).
- **CIFAR10C / CIFAR100C**: the clean ``cifar10/train/<class>/`` images -> the
  ``cifar10_c/<DATASET.CIFAR_C_TYPE>/<DATASET.CIFAR_C_LEVEL>/<class>/`` ones
  (Dassl leaves the class names empty).

Where Dassl would train on wrong labels or crash, a reader raises one line
instead: a class folder missing from one domain (Dassl numbers each domain's
folders on their own, so every later label would shift), a split file naming
images that do not exist, a Digit-5 or DigitSingle domain smaller than the
share Dassl takes from it, VisDA17 or CIFAR-C asked for other domains. Each line says where the data comes from (Dassl's
``DATASETS.md``).

Long because it holds one reader per Dassl dataset format (thirteen of them), each short, kept side by
side as Dassl keeps its datasets: a reader is checked against its neighbours' conventions, and
splitting them would scatter Dassl's shared quirks (the subsampling order, the domain indices).
"""

from __future__ import annotations

import difflib
import os
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dael_plugin.data.items import Item
from dael_plugin.data.registry import DATASETS, register_dataset
from dael_plugin.errors import DAELConfigError

DATASETS_MD = "https://github.com/KaiyangZhou/Dassl.pytorch/blob/master/DATASETS.md"

Pairs = List[Tuple[str, int, str]]  # (path, label, classname) of one domain and split
Splits = Dict[str, Optional[List[Item]]]  # train_x, train_u, val, test


@dataclass(frozen=True)
class Format:
    dataset_dir: str  # under --root
    domains: Tuple[str, ...]
    unlabeled_target: bool  # DA (the target's train split is train_u) or DG
    read: Callable[..., Splits]  # (dataset path, sources, targets, seed, category_shift)
    layout: str  # what the reader expects, for error lines
    anchor: str  # DATASETS.md's section
    seeded: Tuple[str, ...] = ()  # domains whose images are a subsample drawn from SEED
    options: Tuple[str, ...] = ()  # DATASET keys the reader reads beyond the domains (CIFAR-C's corruption)
    official_split = None  # the run names its domains (a WILDS dataset names its split's parts)

    def load(self, name, root, sources, targets, seed, category_shift=False, options=None) -> Dict[str, object]:
        """The splits and class names (data/registry.py's entry protocol)."""
        return read_format(name, root, sources, targets, seed, category_shift, options)


def _where(fmt_anchor: str) -> str:
    return f"{DATASETS_MD}#{fmt_anchor}"


def dataset_folder(name: str, root: str, fmt) -> str:
    """``<root>/<fmt.dataset_dir>``; where it is missing, one line naming the layout and the download."""
    path = os.path.join(root, fmt.dataset_dir)
    if not os.path.isdir(path):
        raise DAELConfigError(
            f"dataset folder {path} not found: {name} is read from <root>/{fmt.dataset_dir}/{fmt.layout}; "
            f"set --root to the folder that holds {fmt.dataset_dir}/ (get the data as {_where(fmt.anchor)} says)"
        )
    return path


def _listdir(path: str) -> List[str]:
    """Dassl's ``listdir_nohidden``: the folder's own order, hidden names left out."""
    return [f for f in os.listdir(path) if not f.startswith(".")]


def _need_dir(path: str, what: str, anchor: str) -> None:
    if not os.path.isdir(path):
        parent = os.path.dirname(path)
        found = sorted(_listdir(parent))[:8] if os.path.isdir(parent) else None
        seen = f"{parent} holds {found}" if found is not None else f"{parent} does not exist either"
        raise DAELConfigError(f"missing {what} {path} ({seen}); the data comes as {_where(anchor)} describes")


def _items(pairs_per_domain: Sequence[Pairs]) -> List[Item]:
    return [Item(p, label, d, c) for d, pairs in enumerate(pairs_per_domain) for p, label, c in pairs]


# -- split files (DomainNet, miniDomainNet, PACS) ----------------------------
class _Listing:
    """Each folder listed once, so that checking 600k split lines costs a few hundred listdirs."""

    def __init__(self) -> None:
        self.cache: Dict[str, frozenset] = {}

    def exists(self, path: str) -> bool:
        folder, name = os.path.split(path)
        if folder not in self.cache:
            self.cache[folder] = frozenset(os.listdir(folder)) if os.path.isdir(folder) else frozenset()
        return name in self.cache[folder]


def _read_split_file(
    path: str, image_root: str, anchor: str, listing, label_offset: int = 0
) -> List[Tuple[str, int, str]]:
    """``(absolute path, label, relative path)`` of each ``<relative path> <label>`` line, checked: a missing
    file, a malformed line or a line naming an absent image is one line naming the file."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read below
        raise DAELConfigError(f"split file {path} is not a regular file; put the text file from {_where(anchor)} there")
    if not os.path.isfile(path):
        _need_dir(os.path.dirname(path), "split folder", anchor)
        found = sorted(f for f in _listdir(os.path.dirname(path)) if f.endswith(".txt"))
        raise DAELConfigError(
            f"missing split file {path} (its folder holds {found[:8]}{' ...' if len(found) > 8 else ''}); "
            f"the data comes as {_where(anchor)} describes"
        )
    out: List[Tuple[str, int, str]] = []
    absent: List[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DAELConfigError(
            f"cannot read split file {path} ({type(exc).__name__}): replace it with the one from {_where(anchor)}"
        ) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            if any(rest.strip() for rest in lines[n:]):  # Dassl's reader fails on it: both engines refuse it
                raise DAELConfigError(
                    f"{path}:{n}: a blank line between entries (Dassl's reader stops on it); delete the line"
                )
            continue  # blank lines at the end: nothing after them to lose
        parts = line.strip().split(" ")
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise DAELConfigError(f"{path}:{n}: expected '<image path> <label>', got {line.strip()[:80]!r}")
        if int(parts[1]) < label_offset:
            raise DAELConfigError(
                f"{path}:{n}: label {parts[1]} of {parts[0]!r} is below {label_offset}, where this file's labels "
                f"start; replace the file with the one from {_where(anchor)}"
            )
        impath = os.path.join(image_root, parts[0])
        if not listing.exists(impath):
            absent.append(parts[0])
        out.append((impath, int(parts[1]) - label_offset, parts[0]))
    if absent:
        raise DAELConfigError(
            f"{path} names {len(absent)} of {len(out)} images that do not exist under {image_root} "
            f"(first: {', '.join(absent[:3])}); the download is incomplete, see {_where(anchor)}"
        )
    return out


def _domainnet(split_dir: str, anchor: str, with_val: bool):
    def read(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
        listing = _Listing()

        def split(domains: Sequence[str], name: str) -> List[Item]:
            per_domain = []
            for dname in domains:
                file = os.path.join(path, split_dir, f"{dname}_{name}.txt")
                per_domain.append(
                    [(p, label, rel.split("/")[1]) for p, label, rel in _read_split_file(file, path, anchor, listing)]
                )
            return _items(per_domain)

        return {
            "train_x": split(sources, "train"),
            "train_u": split(targets, "train"),
            "val": split(sources, "test") if with_val else None,
            "test": split(targets, "test"),
        }

    return read


PACS_BROKEN = ("sketch/dog/n02103406_4068-1.png",)  # Dassl's ``_error_paths``


def _pacs(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    listing = _Listing()
    image_dir, split_dir = os.path.join(path, "images"), os.path.join(path, "splits")
    broken = {os.path.join(image_dir, p) for p in PACS_BROKEN}  # absent or not, never read

    def split(domains: Sequence[str], names: Sequence[str]) -> List[Item]:
        per_domain = []
        for dname in domains:
            pairs = []
            for name in names:
                file = os.path.join(split_dir, f"{dname}_{name}_kfold.txt")
                for p, label, rel in _read_split_file(file, image_dir, "pacs", _BrokenAware(listing, broken), 1):
                    if rel not in PACS_BROKEN:
                        pairs.append((p, label, p.split("/")[-2]))
            per_domain.append(pairs)
        return _items(per_domain)

    return {
        "train_x": split(sources, ["train"]),
        "train_u": None,
        "val": split(sources, ["crossval"]),
        "test": split(targets, ["train", "crossval"]),
    }


class _BrokenAware:
    """PACS lists a broken image that Dassl skips: its absence is no error."""

    def __init__(self, listing: _Listing, broken: set) -> None:
        self.listing, self.broken = listing, broken

    def exists(self, path: str) -> bool:
        return path in self.broken or self.listing.exists(path)


# -- class folders (Office31, OfficeHome, VLCS) --------------------------------
def _class_folders(domain_dirs: Sequence[str], anchor: str, category_shift: bool = False) -> List[str]:
    """The sorted class folders, the same in every domain: Dassl numbers each domain's folders
    on its own, so a class missing from one domain would shift every later label there. With
    ``category_shift`` (``DATASET.CATEGORY_SHIFT``) a domain may hold a subset: the sorted union,
    by which every domain's labels are numbered."""
    per = []
    for d in domain_dirs:
        _need_dir(d, "domain folder", anchor)
        per.append(sorted(c for c in _listdir(d) if os.path.isdir(os.path.join(d, c))))
    if category_shift:
        return sorted(set().union(*per))
    for d, classes in zip(domain_dirs[1:], per[1:]):
        if classes != per[0]:
            missing = sorted(set(per[0]) - set(classes))
            extra = sorted(set(classes) - set(per[0]))
            raise DAELConfigError(
                f"class folders differ between {domain_dirs[0]} and {d}: "
                f"{'missing ' + str(missing[:5]) if missing else ''}{' ' if missing and extra else ''}"
                f"{'extra ' + str(extra[:5]) if extra else ''}; Dassl would number each domain's classes "
                "on its own and shift the labels: every domain needs the same class folders, or set "
                "DATASET.CATEGORY_SHIFT True to read the union of the classes (docs/category_shift.md)"
            )
    return per[0]


def _office(lower: bool, anchor: str):
    def read(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
        classes = _class_folders([os.path.join(path, d) for d in list(sources) + list(targets)], anchor, category_shift)

        def split(domains: Sequence[str]) -> List[Item]:
            per_domain = []
            for dname in domains:
                pairs = []
                for label, cname in enumerate(classes):
                    cdir = os.path.join(path, dname, cname)
                    if not os.path.isdir(cdir):
                        continue  # a class this domain lacks (category shift)
                    pairs += [(os.path.join(cdir, f), label, cname.lower() if lower else cname) for f in _listdir(cdir)]
                per_domain.append(pairs)
            return _items(per_domain)

        return {"train_x": split(sources), "train_u": split(targets), "val": None, "test": split(targets)}

    return read


def _vlcs(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    every = [
        os.path.join(path, d.upper(), s) for d in list(sources) + list(targets) for s in ("train", "crossval", "test")
    ]
    # one label space for every split: the union with category shift (Dassl's splits each number their own)
    union = _class_folders([d for d in every if os.path.isdir(d)], "vlcs", True) if category_shift else None

    def split(domains: Sequence[str], name: str) -> List[Item]:
        dirs = [os.path.join(path, d.upper(), name) for d in domains]
        if union is None:
            classes = _class_folders(dirs, "vlcs")
        else:
            for d in dirs:
                _need_dir(d, "domain folder", "vlcs")
            classes = union
        per_domain = []
        for sdir in dirs:
            pairs = []
            for label, cname in enumerate(classes):
                cdir = os.path.join(sdir, cname)
                if not os.path.isdir(cdir):
                    continue  # a class this domain lacks (category shift)
                # glob.glob("*.jpg")'s order and filter: the listing's order, hidden names left out
                pairs += [(os.path.join(cdir, f), label, cname) for f in _listdir(cdir) if f.endswith(".jpg")]
            per_domain.append(pairs)
        return _items(per_domain)

    return {
        "train_x": split(sources, "train"),
        "train_u": None,
        "val": split(sources, "crossval"),
        "test": split(targets, "test"),
    }


# -- Digit-5 ------------------------------------------------------------------
DIGIT5_CAPS = {"train": 25000, "test": 9000}  # MNIST, MNIST-M, SVHN, SYN (M3SDA's protocol)
DIGIT5_USPS_REPEAT = 3  # USPS's training list, to match the others' size


def _digit5(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    rng = random.Random(seed)  # Dassl draws from Python's global RNG, seeded by set_random_seed(SEED)

    def domain(dname: str, split: str) -> Pairs:
        im_dir = os.path.join(path, dname, f"{split}_images")
        _need_dir(im_dir, "image folder", "digit-5")
        pairs: Pairs = []
        for name in _listdir(im_dir):
            label = _digit_label(im_dir, name, "digit-5")
            pairs.append((os.path.join(im_dir, name), label, str(label)))
        if dname == "usps":
            return pairs * DIGIT5_USPS_REPEAT if split == "train" else pairs
        cap = DIGIT5_CAPS[split]
        if len(pairs) < cap:
            raise DAELConfigError(
                f"{im_dir} holds {len(pairs):,} images; Digit-5's protocol samples {cap:,} from it (Dassl's "
                f"reader would stop here): the folder is incomplete, see {_where('digit-5')}"
            )
        return rng.sample(pairs, cap)

    def split(domains: Sequence[str], name: str) -> List[Item]:
        items = _items([domain(d, name) for d in domains])
        return [i._replace(classname=str(i.label)) for i in items]

    train_x = split(sources, "train")  # Dassl's order of draws
    train_u = split(targets, "train")
    return {"train_x": train_x, "train_u": train_u, "val": None, "test": split(targets, "test")}


DIGIT_SINGLE_CAP = 10000  # the first of each training folder's listing (Volpi et al.'s protocol), USPS's all


def _digit_single(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    """Dassl's DigitSingle: Digit-5's folders, no draw: the sources' training folders cut to their
    listing's first 10,000, validation on the sources' test folders, test on the targets'."""

    def split(domains: Sequence[str], name: str) -> List[Item]:
        per_domain = []
        for dname in domains:
            im_dir = os.path.join(path, dname, f"{name}_images")
            _need_dir(im_dir, "image folder", "digit-single")
            pairs = [(os.path.join(im_dir, f), _digit_label(im_dir, f, "digit-single"), "") for f in _listdir(im_dir)]
            if name == "train" and dname != "usps":
                if len(pairs) < DIGIT_SINGLE_CAP:  # Dassl would train on fewer without a word
                    raise DAELConfigError(
                        f"{im_dir} holds {len(pairs):,} images; DigitSingle trains on its first {DIGIT_SINGLE_CAP:,}: "
                        f"the folder is incomplete, see {_where('digit-single')}"
                    )
                pairs = pairs[:DIGIT_SINGLE_CAP]
            per_domain.append([(p, label, str(label)) for p, label, _ in pairs])
        return _items(per_domain)

    return {
        "train_x": split(sources, "train"),
        "train_u": None,
        "val": split(sources, "test"),
        "test": split(targets, "test"),
    }


def _digit_label(im_dir: str, name: str, anchor: str) -> int:
    parts = os.path.splitext(name)[0].split("_")
    if len(parts) < 2 or not parts[1].isdigit():
        raise DAELConfigError(
            f"{os.path.join(im_dir, name)}: Digit-5 file names are <id>_<label>.<ext>, "
            f"as {_where(anchor)} builds them; move other files out of {im_dir}"
        )
    return int(parts[1])


# -- VisDA17, CIFAR10-STL10 (one source domain) ---------------------------------
def _visda17(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    """``{train,validation}/image_list.txt`` of ``<class>/<image> <label>`` lines: the synthetic
    images are the source, the real ones the target (train_u and test), every item domain 0."""
    if list(sources) != ["synthetic"] or list(targets) != ["real"]:  # Dassl reads these whatever is asked
        raise DAELConfigError(
            f"VisDA17 is synthetic -> real (Dassl's reader takes train/ as the source and validation/ as the "
            f"target whatever the domains say), not {list(sources)} -> {list(targets)}; pass "
            "--source-domains synthetic --target-domains real"
        )
    listing = _Listing()

    def read(folder: str) -> List[Item]:
        file, image_root = os.path.join(path, folder, "image_list.txt"), os.path.join(path, folder)
        return _items(
            [
                [
                    (p, label, rel.split("/")[0])
                    for p, label, rel in _read_split_file(file, image_root, "visda17", listing)
                ]
            ]
        )

    real = read("validation")
    return {"train_x": read("train"), "train_u": real, "val": None, "test": list(real)}


def _cifar_stl(path: str, sources: Sequence[str], targets: Sequence[str], seed: int, category_shift: bool) -> Splits:
    """``<domain>/{train,test}/<label>_<class>/<image>``: the label is the folder's number (Dassl's
    script writes ``000_airplane``), in the folders' own order."""

    def split(domains: Sequence[str], name: str) -> List[Item]:
        per_domain = []
        for dname in domains:
            sdir = os.path.join(path, dname, name)
            _need_dir(sdir, "split folder", "cifar10-stl10")
            pairs = []
            for folder in _listdir(sdir):
                number, _, cname = folder.partition("_")
                if not number.isdigit() or not cname or not os.path.isdir(os.path.join(sdir, folder)):
                    raise DAELConfigError(
                        f"{os.path.join(sdir, folder)}: class folders are <label>_<class> (000_airplane), as "
                        f"{_where('cifar10-stl10')} builds them; move other entries out of {sdir}"
                    )
                cdir = os.path.join(sdir, folder)
                pairs += [(os.path.join(cdir, f), int(number), cname) for f in _listdir(cdir)]
            per_domain.append(pairs)
        return _items(per_domain)

    return {
        "train_x": split(sources, "train"),
        "train_u": split(targets, "train"),
        "val": None,
        "test": split(targets, "test"),
    }


# -- CIFAR-10-C, CIFAR-100-C (DG: the clean training images -> one corruption at one severity) ------
CIFAR_C_TYPES = (
    "brightness contrast defocus_blur elastic_transform fog frost gaussian_blur gaussian_noise glass_blur "
    "impulse_noise jpeg_compression motion_blur pixelate saturate shot_noise snow spatter speckle_noise zoom_blur"
).split()  # Dassl's AVAI_C_TYPES: Hendrycks & Dietterich's 15 corruptions and their 4 extra ones
CIFAR_C_KEYS = ("CIFAR_C_TYPE", "CIFAR_C_LEVEL")


def _cifar_c(clean: str, corrupted: str, anchor: str):
    """``<clean>/train/<class>/<image>`` -> ``<corrupted>/<CIFAR_C_TYPE>/<CIFAR_C_LEVEL>/<class>/<image>``
    (Dassl's dataset folder is --root itself): train_x and test, every item domain 0, labels by the
    sorted class folders."""

    def read(path: str, sources, targets, seed: int, category_shift: bool, options: dict) -> Splits:
        if list(sources) != [clean] or list(targets) != [corrupted]:  # Dassl's reader asserts these
            raise DAELConfigError(
                f"this dataset is {clean} -> {corrupted} (its test images are {corrupted}'s, its training images "
                f"{clean}'s), not {list(sources)} -> {list(targets)}; pass --source-domains {clean} "
                f"--target-domains {corrupted}"
            )
        c_type, level = options["CIFAR_C_TYPE"], options["CIFAR_C_LEVEL"]
        if c_type not in CIFAR_C_TYPES:
            close = difflib.get_close_matches(str(c_type), CIFAR_C_TYPES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DAELConfigError(
                f"DATASET.CIFAR_C_TYPE {c_type!r} is not a corruption of the set{hint}; set it to one of {CIFAR_C_TYPES}"
            )
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 5:
            raise DAELConfigError(f"DATASET.CIFAR_C_LEVEL {level!r}: the corruption's severity is 1 to 5")
        train_dir, test_dir = os.path.join(path, clean, "train"), os.path.join(path, corrupted, c_type, str(level))
        # one label space: Dassl numbers each folder's classes on its own, so a class missing from the
        # test folder would shift every later label there
        classes = _class_folders([train_dir, test_dir], anchor, category_shift)

        def split(folder: str) -> List[Item]:
            pairs = []
            for label, cname in enumerate(classes):
                cdir = os.path.join(folder, cname)
                if os.path.isdir(cdir):  # (a class the folder lacks: category shift)
                    pairs += [(os.path.join(cdir, f), label, cname) for f in _listdir(cdir)]
            return _items([pairs])

        return {"train_x": split(train_dir), "train_u": None, "val": None, "test": split(test_dir)}

    return read


def _format(dataset_dir, domains, da, read, layout, anchor, seeded=(), options=()) -> Format:
    return Format(dataset_dir, tuple(domains.split()), da, read, layout, anchor, tuple(seeded), tuple(options))


_SPLITS = "{train,test}.txt + the images they name"
_FORMATS: Dict[str, Format] = {
    # name: (folder under --root, domains, DA?, reader, layout, DATASETS.md section)
    "Digit5": _format(
        "digit5", "mnist mnist_m svhn syn usps", True, _digit5, "<domain>/{train,test}_images/<id>_<label>.<ext>", "digit-5",
        seeded=("mnist", "mnist_m", "svhn", "syn"),
    ),
    "DomainNet": _format(
        "domainnet", "clipart infograph painting quickdraw real sketch", True,
        _domainnet("splits", "domainnet", True), f"splits/<domain>_{_SPLITS}", "domainnet",
    ),
    "miniDomainNet": _format(
        "domainnet", "clipart painting real sketch", True,
        _domainnet("splits_mini", "minidomainnet", False), f"splits_mini/<domain>_{_SPLITS}", "minidomainnet",
    ),
    "Office31": _format(
        "office31", "amazon webcam dslr", True, _office(False, "office-31"), "<domain>/<class>/<image>", "office-31"
    ),
    "OfficeHome": _format(
        "office_home", "art clipart product real_world", True,
        _office(True, "office-home"), "<domain>/<class>/<image>", "office-home",
    ),
    "PACS": _format(
        "pacs", "art_painting cartoon photo sketch", False,
        _pacs, "images/<domain>/<class>/<image> + splits/<domain>_{train,crossval}_kfold.txt", "pacs",
    ),
    "VLCS": _format(
        "VLCS", "caltech labelme pascal sun", False, _vlcs, "<DOMAIN>/{train,crossval,test}/<class>/*.jpg", "vlcs"
    ),
    "VisDA17": _format(
        "visda17", "synthetic real", True, _visda17, "{train,validation}/image_list.txt + the images they name", "visda17"
    ),
    "CIFARSTL": _format(
        "cifar_stl", "cifar stl", True, _cifar_stl, "<domain>/{train,test}/<label>_<class>/<image>", "cifar10-stl10"
    ),
    "DigitSingle": _format(
        "digit5", "mnist mnist_m svhn syn usps", False, _digit_single, "<domain>/{train,test}_images/<id>_<label>.<ext>",
        "digit-single",
    ),
    "CIFAR10C": _format(
        "", "cifar10 cifar10_c", False, _cifar_c("cifar10", "cifar10_c", "cifar-10-c"),
        "cifar10/train/<class>/<image> + cifar10_c/<type>/<level>/<class>/<image>", "cifar-10-c", options=CIFAR_C_KEYS,
    ),
    "CIFAR100C": _format(
        "", "cifar100 cifar100_c", False, _cifar_c("cifar100", "cifar100_c", "cifar-100-c"),
        "cifar100/train/<class>/<image> + cifar100_c/<type>/<level>/<class>/<image>", "cifar-100-c",
        options=CIFAR_C_KEYS,
    ),
}  # fmt: skip
for _name, _fmt in _FORMATS.items():  # into the one registry of datasets
    register_dataset(_name, _fmt)


def classnames_of(name: str, splits: Splits) -> List[str]:
    """Class names by label: Dassl's ``get_lab2cname`` over train_x, completed from the other
    splits; every label from 0 to the largest needs a name."""
    names: Dict[int, str] = {}
    first: Dict[str, tuple] = {}  # class name -> (label, an image of it): one name, one label
    for key in ("train_x", "val", "train_u", "test"):
        for item in splits.get(key) or []:
            names.setdefault(item.label, item.classname)
            label, where = first.setdefault(item.classname, (item.label, item.impath))
            if label != item.label:  # an edited label: it would pass for category shift, or a class of its own
                raise DAELConfigError(
                    f"{name}: class {item.classname!r} has label {label} ({where}) and label {item.label} "
                    f"({item.impath}); one label per class: fix the split file that lists the second"
                )
    if not names:
        return []
    missing = [k for k in range(max(names) + 1) if k not in names]
    if missing or min(names) < 0:
        raise DAELConfigError(
            f"{name}: labels {missing[:5] or [min(names)]} have no image in any split of these domains; "
            "the split files skip or mislabel a class"
        )
    return [names[k] for k in range(len(names))]


def read_format(
    name: str,
    root: str,
    sources: Sequence[str],
    targets: Sequence[str],
    seed: int,
    category_shift: bool = False,
    options: Optional[dict] = None,
) -> Dict[str, object]:
    """The splits and class names of ``name`` under ``root``. The source domains must hold the same
    classes; with ``category_shift`` (``DATASET.CATEGORY_SHIFT``) they may hold different ones, and
    the label space is their union (class folders: the sorted union; split files and Digit-5: the
    files' labels, which are already the union's)."""
    from dael_plugin.data.classes import check_union, classes_by_domain, describe

    fmt = DATASETS[name]
    path = dataset_folder(name, root, fmt)
    extra = (dict(options or {}),) if fmt.options else ()  # the DATASET keys it reads (CIFAR-C's)
    splits = fmt.read(path, sources, targets, seed, category_shift, *extra)
    out: Dict[str, object] = dict(splits)
    out["classnames"] = names = classnames_of(name, splits)
    held = classes_by_domain(splits["train_x"] or [], len(sources), len(names))
    if category_shift:
        check_union(held, sources, names)
    elif any(row != held[0] for row in held):
        raise DAELConfigError(
            f"{name}: the source domains hold different classes ({'; '.join(describe(held, sources, names))[:300]}); "
            "set DATASET.CATEGORY_SHIFT True to read the union of the classes (docs/category_shift.md), "
            "or complete the split files"
        )
    return out
