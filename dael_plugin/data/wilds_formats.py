"""Dassl's WILDS datasets (Camelyon17, FMoW, IWildCam), read without Dassl.

A WILDS dataset brings its own split (Koh et al., ICML 2021): train, an out-of-distribution val
and an out-of-distribution test, each of many metadata domains (hospitals; region x year;
camera traps). Dassl's readers (``dassl/data/datasets/dg/wilds/``) take the items from the
``wilds`` package's metadata; so does this one, so that the items are Dassl's: the same paths,
labels, class names, order, and domain numbers (each split's own, in the order of a Python set
of the metadata domains, as Dassl's ``relabel_domain``).

Here the run's domains name the split's parts: the one source ``train``, the one target ``test``.
An item's ``domain`` keeps the metadata's number, which the domain samplers and DomainMix read as
Dassl's do; for every per-domain figure the plugin counts (records, fingerprints, class tables)
the items are of their one named domain (:func:`dael_plugin.data.items.named_domain`). WILDS's
val is of neither named domain: it is not a source validation split (``source_val`` holds part
of ``train`` out, as for any dataset without one).

Beyond Dassl, a run may name the train split's metadata domains as its sources instead
(``--source-domains hospital_0 hospital_3 hospital_4`` on Camelyon17; FMoW's are ``<region>_<year>``,
iWildCam's ``location_<n>``): each item is then of its own named domain, so a method with an
output per source domain (DAELDG's experts, CrossGrad's and DDAIG's domain classifiers) trains
with one per domain, on both engines. The items, the val and the test split are the same.

Not kept from Dassl: its reader saves the items to ``zhou_preloaded.pkl`` in the data folder and
unpickles that file on later runs, whatever the metadata says by then; this one reads the
metadata every time and never loads a pickle. Dassl's ``download=True`` becomes a one-line
error naming the missing release file (no downloads here).
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dael_plugin.data.items import Item
from dael_plugin.data.registry import register_dataset
from dael_plugin.errors import DAELConfigError

DOWNLOADS = "https://wilds.stanford.edu/downloads"
WILDS_SPLIT = (("train",), ("test",))  # the run's domains: WILDS's train split -> its OOD test split

FMOW_CATEGORIES = (
    "airport airport_hangar airport_terminal amusement_park aquaculture archaeological_site barn "
    "border_checkpoint burial_site car_dealership construction_site crop_field dam debris_or_rubble "
    "educational_institution electric_substation factory_or_powerplant fire_station flooded_road fountain "
    "gas_station golf_course ground_transportation_station helipad hospital impoverished_settlement "
    "interchange lake_or_pond lighthouse military_facility multi-unit_residential nuclear_powerplant "
    "office_building oil_or_gas_facility park parking_lot_or_garage place_of_worship police_station port "
    "prison race_track railway_bridge recreational_facility road_bridge runway shipyard shopping_mall "
    "single-unit_residential smokestack solar_farm space_facility stadium storage_tank surface_mine "
    "swimming_pool toll_booth tower tunnel_opening waste_disposal water_treatment_facility wind_farm zoo"
).split()  # Dassl's fmow.CATEGORIES, WILDS's order


def _camelyon17(data, idx: int, folder: str) -> Tuple[str, int]:
    return os.path.join(folder, data._input_array[idx]), int(data.metadata_array[idx][0])  # the hospital


def _fmow(data, idx: int, folder: str) -> Tuple[str, int]:
    image = os.path.join(folder, "images", f"rgb_img_{data.full_idxs[idx]}.png")
    return image, int(data.metadata_array[idx][0]) * 16 + int(data.metadata_array[idx][1])  # region x year


def _iwildcam(data, idx: int, folder: str) -> Tuple[str, int]:
    return os.path.join(folder, "train", data._input_array[idx]), int(data.metadata_array[idx][0])  # the camera


def _hospital(data, domain: int) -> str:
    return f"hospital_{domain}"


def _region_year(data, domain: int) -> str:
    return f"{data._metadata_map['region'][domain // 16]}_{2002 + domain % 16}"  # (wilds' region names)


def _location(data, domain: int) -> str:
    return f"location_{domain}"


def _fixed_names(names: Sequence[str]) -> Callable[[str], Dict[int, str]]:
    return lambda folder: dict(enumerate(names))


def _iwildcam_names(folder: str) -> Dict[int, str]:
    import pandas as pd

    return dict(pd.read_csv(os.path.join(folder, "categories.csv"))["name"])  # Dassl's: by the file's row


_LOADED: Dict[Tuple[str, str], object] = {}  # (name, folder) -> the wilds dataset the splits were last read from


@dataclass(frozen=True)
class WildsFormat:
    """A WILDS dataset (data/registry.py's entry protocol)."""

    wilds_name: str  # wilds.get_dataset's name
    version: str  # the release Dassl's folder names
    item: Callable  # (wilds dataset, index, folder) -> (image path, metadata domain)
    domain_name: Callable  # (wilds dataset, metadata domain) -> its name as a source domain
    names: Callable[[str], Dict[int, str]]  # folder -> {label: class name}, Dassl's load_classnames
    layout: str
    domains: Tuple[str, ...] = WILDS_SPLIT[0] + WILDS_SPLIT[1]
    unlabeled_target: bool = False  # DG
    seeded: Tuple[str, ...] = ()
    options: Tuple[str, ...] = ("NUM_SHOTS",)  # Dassl's few-shot training split
    official_split: Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]] = WILDS_SPLIT

    @property
    def dataset_dir(self) -> str:
        return f"{self.wilds_name}_v{self.version}"

    def load(self, name, root, sources, targets, seed=0, category_shift=False, options=None) -> Dict[str, object]:
        """The splits and class names, as Dassl's ``WILDSBase`` reads them."""
        if category_shift and not names_metadata_sources(name, sources):
            raise DAELConfigError(
                f"{name} has one source domain (WILDS's train split): DATASET.CATEGORY_SHIFT has no domains to "
                "differ; set it False"
            )
        folder = os.path.join(root, self.dataset_dir)
        data = self._wilds(name, root, folder)
        _LOADED[(name, folder)] = data  # (the run's last test reads the same metadata: official_metrics)
        label_to_name = self.names(folder)
        splits = {k: self._read(data, k, folder, label_to_name, name) for k in ("train", "val", "test")}
        splits = {k: self._sources(data, v, sources, name) if k == "train" else _relabel(v) for k, v in splits.items()}
        shots = (options or {}).get("NUM_SHOTS", -1)
        if isinstance(shots, bool) or not isinstance(shots, int):
            raise DAELConfigError(f"DATASET.NUM_SHOTS {shots!r}: the training images of each class and domain, an int")
        if shots > 0:
            splits["train"] = few_shot(splits["train"], shots, seed)
        # Dassl's number of classes: the largest training label + 1 (DatasetBase.get_num_classes)
        n = max(it.label for it in splits["train"]) + 1 if splits["train"] else 0
        return {
            "train_x": splits["train"],
            "train_u": None,
            "val": splits["val"],
            "test": splits["test"],
            "classnames": [label_to_name.get(k, str(k)) for k in range(n)],
        }

    def _wilds(self, name: str, root: str, folder: str):
        try:
            from wilds import get_dataset
        except ImportError:
            raise DAELConfigError(
                f"{name} is read through the wilds package's metadata, as Dassl reads it: pip install wilds"
            ) from None
        release = os.path.join(folder, f"RELEASE_v{self.version}.txt")
        if not os.path.isfile(release):
            seen = "does not exist" if not os.path.isdir(folder) else f"holds {sorted(os.listdir(folder))[:8]}"
            raise DAELConfigError(
                f"{name}: {release} not found ({folder} {seen}); WILDS reads a dataset whose release file is "
                f"there: set --root to the folder that holds {self.dataset_dir}/, unpacked from {DOWNLOADS}"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # wilds' own warnings on its arrays
                return get_dataset(dataset=self.wilds_name, version=self.version, root_dir=root, download=False)
        except (OSError, ValueError, KeyError, IndexError, TypeError, AssertionError) as exc:
            raise DAELConfigError(
                f"{name}: wilds could not read the metadata under {folder} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); unpack the release again from {DOWNLOADS}"
            ) from None

    def _sources(self, data, items: List[Item], sources: Sequence[str], name: str) -> List[Item]:
        """The train split's items, their domains numbered as Dassl numbers them (:func:`_relabel`)
        under the one source ``train``; where the run names the split's metadata domains instead
        (:func:`names_metadata_sources`), each item's domain is its domain's place among them, so a
        method with an output per source domain has one per hospital (camera, region x year)."""
        if not names_metadata_sources(name, sources):
            return _relabel(items)
        names = {d: self.domain_name(data, d) for d in set(it.domain for it in items)}  # (in Dassl's order)
        if sorted(sources) != sorted(names.values()):
            raise DAELConfigError(
                f"{name}'s train split holds the metadata domains {list(names.values())}, not {list(sources)}: name "
                f"each of them once with --source-domains (their order is the order of a method's per-domain "
                f"outputs), or leave --source-domains out to train on the one source {list(WILDS_SPLIT[0])}"
            )
        place = {d: list(sources).index(n) for d, n in names.items()}
        return [it._replace(domain=place[it.domain]) for it in items]

    def _read(self, data, split: str, folder: str, label_to_name: Dict[int, str], name: str) -> List[Item]:
        """Dassl's ``read_data``: one item per index of the split, of its metadata domain (as numbered
        in the metadata; :func:`_relabel` renumbers them as Dassl does)."""
        subset = data.get_subset(split)
        labels = [int(y) for y in data.y_array[subset.indices]]
        items = []
        for idx, label in zip(subset.indices, labels):
            if label not in label_to_name:  # Dassl's reader stops on a KeyError here
                raise DAELConfigError(
                    f"{name}: label {label} of the {split} split has no class name in the release under {folder}; "
                    f"unpack the release again from {DOWNLOADS}"
                )
            path, domain = self.item(data, int(idx), folder)
            items.append(Item(path, label, domain, label_to_name[label]))
        return items


def _relabel(items: List[Item]) -> List[Item]:
    """Dassl's ``relabel_domain``: a split's domains numbered in the order of a Python set of them."""
    mapping = {domain: i for i, domain in enumerate(set([it.domain for it in items]))}
    return [it._replace(domain=mapping[it.domain]) for it in items]


def names_metadata_sources(name: str, sources: Sequence[str]) -> bool:
    """Whether a run on WILDS dataset ``name`` names its train split's metadata domains as its source
    domains (Camelyon17's ``hospital_0 hospital_3 hospital_4``) instead of the one source ``train``,
    which Dassl's readers give. Not Dassl's: its reader numbers the same domains whatever the run
    names, so its trainers' per-domain outputs would follow the metadata's order, not the names."""
    return is_wilds(name) and bool(sources) and tuple(sources) != WILDS_SPLIT[0]


def few_shot(items: List[Item], shots: int, seed: int) -> List[Item]:
    """Dassl's ``NUM_SHOTS`` (``WILDSBase``, ``DatasetBase.generate_fewshot_dataset``): per domain and,
    within it, per label (each in the order it first appears), ``shots`` items drawn with
    ``random.sample`` from the seed (Python's RNG, which Dassl's ``set_random_seed`` seeds), or every
    item where there are no more."""
    rng = random.Random(seed)
    by_domain: Dict[int, Dict[int, List[Item]]] = {}
    for it in items:
        by_domain.setdefault(it.domain, {}).setdefault(it.label, []).append(it)
    out: List[Item] = []
    for by_label in by_domain.values():
        for group in by_label.values():
            out += rng.sample(group, shots) if len(group) >= shots else group
    return out


def is_wilds(name: str) -> bool:
    return str(name) in _FORMATS


def official_metrics(name: str, root: str, split: str, labels: Sequence[int], predictions: Sequence[int]):
    """``(metrics, text)``: the figures WILDS's own evaluation (its datasets' ``eval``) reports for
    ``predictions`` over the ``split`` (``test``, or ``val``: the OOD val), one per item in the
    reader's order, as fractions, under WILDS's names: ``acc_avg`` for each; Camelyon17's ``acc_wg``
    (the worst slide); FMoW's ``acc_worst_region`` (over the regions the split holds, its "Other"
    region left out, as WILDS leaves it out) and ``acc_worst_year``; iWildCam's ``F1-macro_all`` and
    ``recall-macro_all`` (scikit-learn's, over the labels the split holds). Computed here, because
    wilds' own group averages import ``torch_scatter``, a compiled extension; a test holds them to
    wilds' ``eval``. None for a dataset that is not WILDS's, or predictions that are not one per
    item (images left out unread); ``labels`` are checked against WILDS's (predictions in another
    order, a release changed since the run read it): where they differ, a line says so and it is
    None, never a figure of other items."""
    fmt = _FORMATS.get(name)
    if fmt is None or split not in ("test", "val"):
        return None
    import torch

    root = os.path.abspath(os.path.expanduser(root or "."))
    folder = os.path.join(root, fmt.dataset_dir)
    if (name, folder) not in _LOADED:  # (a process that did not read the splits: --eval-only's Dassl engine)
        _LOADED[(name, folder)] = fmt._wilds(name, root, folder)
    data = _LOADED[(name, folder)]
    subset = data.get_subset(split)
    y = torch.as_tensor(data.y_array[subset.indices]).long()
    if len(predictions) != len(y):
        return None
    if not torch.equal(y, torch.as_tensor(list(labels)).long()):
        print(
            f"warning: {name}: the {split} labels scored are not WILDS's {split} split under {folder} in its order "
            "(the release changed since the run read it?); WILDS's figures are left out"
        )
        return None
    p, meta = torch.as_tensor(list(predictions)).long(), data.metadata_array[subset.indices]
    hit = (p == y).double()
    out = {"acc_avg": float(hit.mean())}
    if name == "Camelyon17":
        out["acc_wg"] = _worst(hit, meta[:, 1])  # by slide
    elif name == "FMoW":
        regions = data._metadata_map["region"]  # (the groups' names: wilds' CombinatorialGrouper's)
        keep = torch.tensor(["Other" not in regions[int(r)] for r in meta[:, 0]], dtype=torch.bool)
        out["acc_worst_region"] = _worst(hit[keep], meta[keep, 0])
        out["acc_worst_year"] = _worst(hit, meta[:, 1])
    elif name == "IWildCam":
        from sklearn.metrics import f1_score, recall_score

        present = torch.unique(y).numpy()
        out["recall-macro_all"] = float(recall_score(y.numpy(), p.numpy(), average="macro", labels=present))
        out["F1-macro_all"] = float(f1_score(y.numpy(), p.numpy(), average="macro", labels=present))
    text = "; ".join(f"{k} {v:.3f}" for k, v in out.items())
    return {k: round(v, 6) for k, v in out.items()}, text


def _worst(hit, groups) -> float:
    """wilds' worst-group figure: the smallest of the groups' means over the groups with an item (0 with none)."""
    means = [float(hit[groups == g].mean()) for g in groups.unique()]
    return min(means) if means else 0.0


_FORMATS = {
    "Camelyon17": WildsFormat(
        "camelyon17", "1.0", _camelyon17, _hospital, _fixed_names(["healthy tissue", "tumor tissue"]),
        "RELEASE_v1.0.txt + metadata.csv + patches/patient_<p>_node_<n>/*.png",
    ),
    "FMoW": WildsFormat(
        "fmow", "1.1", _fmow, _region_year, _fixed_names(FMOW_CATEGORIES),
        "RELEASE_v1.1.txt + rgb_metadata.csv + country_code_mapping.csv + images/rgb_img_<i>.png",
    ),
    "IWildCam": WildsFormat(
        "iwildcam", "2.0", _iwildcam, _location, _iwildcam_names, "RELEASE_v2.0.txt + metadata.csv + categories.csv + train/*.jpg"
    ),
}  # fmt: skip
for _name, _fmt in _FORMATS.items():  # into the one registry of datasets
    register_dataset(_name, _fmt)
