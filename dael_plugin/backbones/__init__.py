"""Backbones usable by both engines: the plugin's own and any timm model."""

from __future__ import annotations

from torch import nn

from dael_plugin.backbones import dynamic_resnet, efficientnet, mixstyle
from dael_plugin.backbones.dassl_cnns import (
    IMAGENET_URLS,
    VGG16,
    DigitsDGConvNet,
    DigitSingleCNN,
    M3SDADigitCNN,
    PreActResNet18,
    WideResNet,
    alexnet,
    dassl_cache_file,
    weights_unreachable,
)
from dael_plugin.backbones.small_cnn import SmallCNN
from dael_plugin.backbones.timm_backbone import PREFIX as TIMM_PREFIX
from dael_plugin.backbones.timm_backbone import TimmBackbone, timm_model_name
from dael_plugin.errors import DAELConfigError

# The plugin's own architectures, by registered name.
OWN_BACKBONES = {
    "dael_small_cnn": SmallCNN,
    "dael_small_cnn_gn": lambda: SmallCNN(norm="gn"),
}

# Dassl's digit backbones and WideResNets, rebuilt key for key (see dassl_cnns); under Dassl, Dassl's own are used.
DASSL_CNNS = {
    "cnn_digit5_m3sda": M3SDADigitCNN,
    "cnn_digitsdg": DigitsDGConvNet,
    "cnn_digitsingle": DigitSingleCNN,
    "wide_resnet_28_2": lambda: WideResNet(28, 2),
    "wide_resnet_16_4": lambda: WideResNet(16, 4),
    "preact_resnet18": PreActResNet18,
}
# Dassl's backbones with torchvision's ImageNet weights (MODEL.BACKBONE.PRETRAINED, Dassl's default:
# the file Dassl reads, from the torch hub cache), rebuilt key for key; built from ``pretrained``
DASSL_IMAGENET = {
    "alexnet": lambda pretrained: alexnet(),
    "vgg16": lambda pretrained: VGG16(not pretrained),
    **{n: (lambda pretrained, n=n: dynamic_resnet.DynamicResNet(n)) for n in dynamic_resnet.names()},
    **{n: (lambda pretrained, n=n: efficientnet.EfficientNet(n)) for n in efficientnet.names()},
}

# Dassl names whose architecture timm builds identically (the built-in engine
# maps them; under Dassl, Dassl's own builders are used). Dassl's pretrained
# ResNets are torchvision's ImageNet weights, so the name carries timm's
# torchvision tag (``.tv_in1k``), not timm's default (``.a1_in1k``).
TIMM_ALIASES = {f"resnet{d}": f"resnet{d}.tv_in1k" for d in (18, 34, 50, 101, 152)}


def register_backbone(name: str):
    """Make a backbone ``MODEL.BACKBONE.NAME name`` on both engines (a decorator, as timm's
    ``register_model``): a class or a function that takes no argument and returns an ``nn.Module``
    with ``out_features`` (its feature size). Dassl's ``BACKBONE_REGISTRY`` gets it at the next
    run's checks. A name taken by another builder, Dassl's digit CNNs or a timm name is refused."""

    def add(builder):
        taken = (name in OWN_BACKBONES and OWN_BACKBONES[name] is not builder) or name in DASSL_CNNS
        taken = taken or name in DASSL_IMAGENET
        if taken or name in TIMM_ALIASES or mixstyle.timm_name(name) or name.startswith(TIMM_PREFIX):
            raise DAELConfigError(f"a backbone named {name!r} exists; give yours another name")
        if not callable(builder):
            raise DAELConfigError(f"register_backbone({name!r}): {builder!r} is not a class or a function")
        OWN_BACKBONES[name] = builder
        return builder

    return add


def build_backbone(name: str, pretrained: bool = False, weights_file: str = "", img_size=None) -> nn.Module:
    """Build a backbone by name without Dassl; it exposes ``out_features``. ``img_size``: the
    images' (height, width), ``INPUT.SIZE`` (a timm model is built for it)."""
    if name in OWN_BACKBONES or name in DASSL_CNNS:
        net = (OWN_BACKBONES.get(name) or DASSL_CNNS[name])()
        if not isinstance(getattr(net, "out_features", None), int):
            raise DAELConfigError(
                f"backbone {name!r} has no integer out_features (its feature size); set it in the builder"
            )
        if weights_file:  # read whenever given, strictly (backbones/weights.py)
            from dael_plugin.backbones.weights import load_backbone_weights

            load_backbone_weights(net, weights_file)
        return net
    if name in DASSL_IMAGENET:
        from dael_plugin.backbones.weights import load_backbone_weights

        net = DASSL_IMAGENET[name](pretrained and not weights_file)
        path = weights_file or (imagenet_file(name) if pretrained else "")
        if path:
            load_backbone_weights(net, path)  # every key of the backbone, its last layer's left out
        return net
    if name.startswith(TIMM_PREFIX):
        return TimmBackbone(timm_model_name(name), pretrained=pretrained, weights_file=weights_file, img_size=img_size)
    if name in TIMM_ALIASES:
        return TimmBackbone(TIMM_ALIASES[name], pretrained=pretrained, weights_file=weights_file, img_size=img_size)
    if mixstyle.timm_name(name):
        return mixstyle.MixingResNet(name, pretrained=pretrained, weights_file=weights_file, img_size=img_size)
    raise DAELConfigError(
        f"MODEL.BACKBONE.NAME={name!r} is not available without Dassl; use one of "
        f"{sorted(OWN_BACKBONES) + sorted(DASSL_CNNS) + ['alexnet', 'vgg16'] + sorted(TIMM_ALIASES)}, Dassl's "
        "MixStyle and EFDMix ResNets (resnet{18,50,101}_{ms,efdmix}_l{1,12,123}), its Dynamic ResNets "
        "(resnet{18,50,101}_dynamic[_ms_l{1,12,123}]), its efficientnet_b0 to _b7 or timm_<any timm model>, or run "
        "with --engine dassl"
    )


def timm_name_of(name: str):
    """The timm model (with its tag) that ``MODEL.BACKBONE.NAME`` builds, or None (the plugin's own
    and Dassl's digit CNNs, a user's registered backbone)."""
    if name.startswith(TIMM_PREFIX):
        return timm_model_name(name)
    return TIMM_ALIASES.get(name) or mixstyle.timm_name(name)


def pretrained_stats(name: str):
    """``(mean, std, model)``: the per-channel mean and std the pretrained weights of the backbone
    ``name`` were made with (timm's ``pretrained_cfg``: CLIP's for CLIP towers, ``0.5`` for the
    AugReg ViTs, ImageNet's for torchvision's ResNets), and the timm model they belong to; None
    where the backbone has no pretrained configuration."""
    model = timm_name_of(name)
    if model is None:
        return None
    import timm

    try:
        pcfg = timm.models.get_pretrained_cfg(model)
    except Exception:  # noqa: BLE001 (an unknown tag: timm says so when it builds)
        return None
    if pcfg is None or not getattr(pcfg, "mean", None) or not getattr(pcfg, "std", None):
        return None
    tag = getattr(pcfg, "tag", None)
    full = model if "." in model or not tag else f"{model}.{tag}"
    return [float(v) for v in pcfg.mean], [float(v) for v in pcfg.std], full


__all__ = [
    "DASSL_CNNS",
    "OWN_BACKBONES",
    "SmallCNN",
    "TIMM_PREFIX",
    "TimmBackbone",
    "build_backbone",
    "pretrained_stats",
    "register_backbone",
    "timm_model_name",
    "timm_name_of",
]


def imagenet_file(name: str) -> str:
    """The torch hub cache's copy of the ImageNet weights Dassl's ``name`` reads (:data:`IMAGENET_URLS`),
    fetched there first where it is missing and the host can be reached, as Dassl's ``load_url``;
    else one line saying where to put it."""
    import os

    import torch

    from dael_plugin.backbones.timm_backbone import host_resolves

    url = IMAGENET_URLS[name]
    path = dassl_cache_file(url)
    if os.path.isfile(path):
        return path
    fix = "put the file there, give MODEL.BACKBONE.WEIGHTS FILE, or set MODEL.BACKBONE.PRETRAINED False"
    if not host_resolves(url):
        raise weights_unreachable(name, url, fix)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.hub.download_url_to_file(url, path, progress=False)  # (a temporary file, renamed when whole)
    except Exception as exc:  # noqa: BLE001 (network, disk: one line)
        raise DAELConfigError(
            f"fetching {url} into {path} failed ({type(exc).__name__}: {str(exc)[:100]}); {fix}"
        ) from None
    return path
