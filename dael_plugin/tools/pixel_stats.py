"""``INPUT.PIXEL_MEAN auto`` / ``INPUT.PIXEL_STD auto``: the mean and std the backbone's pretrained
weights were made with (timm's ``pretrained_cfg``: CLIP's for CLIP towers, 0.5 for the AugReg ViTs,
ImageNet's for torchvision's ResNets), and the one log line that says which values a run normalises
with against the weights'.

yacs refuses a word for a list key, so ``auto`` is taken out of each config file and of the trailing
options as they are merged (the last one to set a key wins, as yacs's merge does), and the values are
written into the config once the backbone is known, before it is frozen: ``results.json``, the
checkpoint and the settings hold the numbers that ran. Read by the plugin's own ``train.py`` (both
engines); Dassl's own ``tools/train.py`` merges with yacs and refuses the word."""

from __future__ import annotations

from typing import Dict, List, Optional

from yacs.config import CfgNode as CN

from dael_plugin.backbones import pretrained_stats
from dael_plugin.errors import DAELConfigError

KEYS = ("PIXEL_MEAN", "PIXEL_STD")
AUTO = "auto"


def _is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().strip("'\"").lower() == AUTO


def take_from_file(loaded: dict, auto: Dict[str, bool]) -> dict:
    """``loaded`` (a config file's mapping) without its ``auto`` values, each noted in ``auto``
    (``INPUT.PIXEL_MEAN`` -> True); a value given as numbers notes False (it wins over an earlier
    ``auto``)."""
    node = loaded.get("INPUT") if isinstance(loaded, dict) else None
    if not isinstance(node, dict):
        return loaded
    kept = dict(node)
    for key in KEYS:
        if key in node:
            auto[f"INPUT.{key}"] = _is_auto(node[key])
            if auto[f"INPUT.{key}"]:
                del kept[key]
    return {**loaded, "INPUT": kept}


def take_from_opts(opts: List[str], auto: Dict[str, bool]) -> List[str]:
    """The trailing ``KEY VALUE`` options without the ``auto`` pairs, noted in ``auto``."""
    out: List[str] = []
    for i in range(0, len(opts) - 1, 2):
        key, value = str(opts[i]), opts[i + 1]
        if key in tuple(f"INPUT.{k}" for k in KEYS):
            auto[key] = _is_auto(value)
            if auto[key]:
                continue
        out += [opts[i], value]
    return out + list(opts[len(opts) - len(opts) % 2 :])


def resolve(cfg: CN, auto: Dict[str, bool]) -> None:
    """Write the pretrained weights' mean and std into the keys set to ``auto``; one line where the
    backbone has no pretrained configuration to take them from."""
    wanted = [k for k, v in auto.items() if v]
    if not wanted:
        return
    name = str(cfg.MODEL.BACKBONE.NAME)
    stats = pretrained_stats(name)
    if stats is None:
        raise DAELConfigError(
            f"{wanted[0]} auto: MODEL.BACKBONE.NAME {name} has no pretrained configuration to take its mean and "
            f'std from (auto reads timm\'s pretrained_cfg); give the values, e.g. {wanted[0]} "[0.485, 0.456, 0.406]"'
        )
    mean, std, _ = stats
    for key in wanted:
        setattr(cfg.INPUT, key.split(".")[1], list(mean if key.endswith("MEAN") else std))


def note(cfg: CN) -> Optional[str]:
    """One line for the run's log where the backbone reads pretrained weights (not a local file):
    whether the images are normalised with the weights' own mean and std, or with others."""
    b = cfg.MODEL.BACKBONE
    if not bool(b.get("PRETRAINED", False)) or str(b.get("WEIGHTS", "") or ""):
        return None
    stats = pretrained_stats(str(b.NAME))
    if stats is None:
        return None
    mean, std, model = stats
    have = [float(v) for v in cfg.INPUT.PIXEL_MEAN], [float(v) for v in cfg.INPUT.PIXEL_STD]
    if all(abs(a - w) <= 1e-6 for got, want in zip(have, (mean, std)) for a, w in zip(got, want)) and all(
        len(got) == len(want) for got, want in zip(have, (mean, std))
    ):
        return f"Pixels normalised with the weights' own mean {_short(mean)} and std {_short(std)} ({model})"
    return (
        f"warning: INPUT.PIXEL_MEAN {_short(have[0])} and PIXEL_STD {_short(have[1])} differ from the mean "
        f"{_short(mean)} and std {_short(std)} the pretrained weights ({model}) were made with; set "
        "INPUT.PIXEL_MEAN auto and INPUT.PIXEL_STD auto to use theirs"
    )


def _short(values) -> str:
    return "[" + ", ".join(f"{float(v):.4g}" for v in values) + "]"
