"""What a run's ``results.json`` and its checkpoints say the backbone started from
(``backbone_weights``): the model and its pretrained tag, where the weights came from and the
sha256 of the file read.

``source`` is ``file`` (``MODEL.BACKBONE.WEIGHTS``), ``cache`` (timm's pretrained weights, found in
the Hugging Face or torch hub cache before the build) or ``hub`` (downloaded by this run's build);
the builds of this process note which (``timm_backbone.weights_source``)."""

from __future__ import annotations

import os
from typing import Optional

from dael_plugin.backbones import TIMM_PREFIX, timm_name_of
from dael_plugin.backbones.dassl_cnns import IMAGENET_URLS, dassl_cache_file, weights_unreachable
from dael_plugin.backbones.timm_backbone import cached_weights_file, host_resolves, weights_source
from dael_plugin.backbones.weights import sha256_of


def _timm_tag(model_name: str) -> Optional[str]:
    """timm's pretrained tag for ``model_name`` (its default where the name gives none)."""
    try:
        import timm

        pcfg = timm.models.get_pretrained_cfg(model_name)
    except Exception:  # noqa: BLE001 (an unknown tag)
        return None
    return getattr(pcfg, "tag", None) if pcfg is not None else None


# Dassl's backbone modules that load ImageNet weights from their ``model_urls``
DASSL_WEIGHT_MODULES = ("resnet", "resnet_dynamic", "alexnet", "vgg")


def dassl_weights_url(name: str) -> Optional[str]:
    """The URL Dassl's own backbone ``name`` reads its pretrained weights from: its module's
    ``model_urls`` entry, the longest that names it or a variant of it (``resnet18_ms_l123`` reads
    ``resnet18``'s, ``resnet18_dynamic_ms_l1`` ``resnet18_dynamic``'s; EfficientNet's ``url_map``);
    None for the others."""
    import importlib

    urls = {}
    for module in DASSL_WEIGHT_MODULES:
        try:
            urls.update(importlib.import_module(f"dassl.modeling.backbone.{module}").model_urls)
        except (ImportError, AttributeError):
            continue
    try:  # EfficientNet's, under its hyphenated names (efficientnet_b0 reads efficientnet-b0's)
        from dassl.modeling.backbone.efficientnet.utils import url_map

        urls.update({k.replace("-", "_"): v for k, v in url_map.items()})
    except ImportError:
        pass
    keys = [k for k in urls if name == k or name.startswith(k + "_")]
    return urls[max(keys, key=len)] if keys else None


def check_dassl_pretrained_reachable(name: str) -> None:
    """Dassl's own pretrained backbone (``resnet18``, ``vgg16``, ...) with its weights neither in the
    torch hub cache nor downloadable: one line (Dassl's ``load_url`` stopped in a traceback)."""
    url = dassl_weights_url(name)
    if url is None or os.path.isfile(dassl_cache_file(url)) or host_resolves(url):
        return
    raise weights_unreachable(name, url, "put the file there, or set MODEL.BACKBONE.PRETRAINED False")


def _dassl_cached_file(name: str) -> Optional[str]:
    """The torch hub cache file Dassl's own pretrained backbone ``name`` reads, where it is there."""
    url = dassl_weights_url(name) or IMAGENET_URLS.get(name)  # (those rebuilt on the built-in engine too)
    path = dassl_cache_file(url) if url else None
    return path if path and os.path.isfile(path) else None


def weights_record(name: str, pretrained: bool, weights_file: str, engine: str = "builtin") -> dict:
    """The ``backbone_weights`` record of a run whose backbone is ``name``: the file given (its
    sha256), timm's pretrained model with its tag, its source and the cached file read (its sha256),
    Dassl's own pretrained backbone (the Dassl engine, and Dassl's alexnet and vgg16 rebuilt on the
    built-in one: the torch hub file read, where there), or
    that none were read (a random start)."""
    if weights_file:
        return {
            "model": name,
            "source": "file",
            "file": os.path.abspath(weights_file),
            "sha256": sha256_of(weights_file),
        }
    if (engine == "dassl" and not name.startswith(TIMM_PREFIX)) or (pretrained and name in IMAGENET_URLS):
        record = {"dassl": name, "pretrained": bool(pretrained)}
        path = _dassl_cached_file(name) if pretrained else None
        if path:  # Dassl's load_url reads the torch hub cache (downloading there first where missing)
            record.update(source="cache", file=os.path.realpath(path), sha256=sha256_of(path))
        return record
    timm_name = timm_name_of(name)
    if pretrained and timm_name:
        record = {"timm": timm_name, "tag": _timm_tag(timm_name)}
        if weights_source(timm_name):
            record["source"] = weights_source(timm_name)
        path = cached_weights_file(timm_name)  # what timm read (it reads from its cache, once fetched)
        if path:
            record.update(file=os.path.realpath(path), sha256=sha256_of(path))
        return record
    return {
        "read": None,
        "why": "MODEL.BACKBONE.PRETRAINED False" if not pretrained else f"{name} has no pretrained weights here",
    }
