"""Backbones in Dassl's ``BACKBONE_REGISTRY``, through its public ``register``: the plugin's own,
and a ``timm_<model>`` that a run names. That any name timm knows resolves from Dassl's own
scripts too is :mod:`dael_plugin.dassl_adapter.timm_names`'s job (the one private hook)."""

from __future__ import annotations

from dassl.modeling.backbone import BACKBONE_REGISTRY
from torch import nn

from dael_plugin.backbones import (
    OWN_BACKBONES,
    TIMM_PREFIX,
    TimmBackbone,
    timm_model_name,
)
from dael_plugin.errors import DAELConfigError


def register_own_backbones() -> None:
    for name, cls in OWN_BACKBONES.items():
        if name not in BACKBONE_REGISTRY.registered_names():
            BACKBONE_REGISTRY.register(_own_factory(cls, name))  # Dassl keys a factory by its __name__


def timm_factory(name: str, weights_file: str, img_size=None):
    def factory(pretrained=True, **kwargs):
        kwargs.pop("verbose", None)
        return TimmBackbone(
            timm_model_name(name),
            pretrained=pretrained,
            weights_file=kwargs.pop("weights_file", weights_file),
            img_size=kwargs.pop("img_size", img_size),
        )

    factory.__name__ = name
    return factory


def _own_factory(cls, name: str, weights_file: str = ""):
    def factory(pretrained=False, **kwargs):
        net = cls()
        if weights_file:  # MODEL.BACKBONE.WEIGHTS, read strictly (backbones/weights.py)
            from dael_plugin.backbones.weights import load_backbone_weights

            load_backbone_weights(net, weights_file)
        return net

    factory.__name__ = name
    return factory


def register_timm_backbone(name: str, weights_file: str = "", img_size=None) -> None:
    """Make ``timm_<model>`` buildable by Dassl's ``build_backbone`` for images of ``img_size``
    (``INPUT.SIZE``), and the plugin's own backbones read ``weights_file``.

    Dassl passes only ``pretrained`` to a factory, so the timm model name, the local weights file
    and the input size are carried by the registered closure (Dassl's own trainers, M3SDA's and
    MME's, build through it too).
    """
    if name in OWN_BACKBONES:  # the plugin's own, with this run's weights file (or none)
        BACKBONE_REGISTRY.register(_own_factory(OWN_BACKBONES[name], name, weights_file), force=True)
        return
    if not name.startswith(TIMM_PREFIX):
        return
    BACKBONE_REGISTRY.register(timm_factory(name, weights_file, img_size), force=True)  # keyed by name


def build_dassl_backbone(name: str, pretrained: bool = False, weights_file: str = "", img_size=None) -> nn.Module:
    """``MODEL.BACKBONE`` built as Dassl's ``SimpleNet`` builds it, through Dassl's
    ``build_backbone``: any backbone its ``BACKBONE_REGISTRY`` holds (Dassl's own, with Dassl's
    pretrained weights; the plugin's own and ``timm_<model>`` for ``img_size``, with
    ``weights_file``). The Dassl engine's host builds a method's backbones with it
    (dassl_adapter/method_trainer.py), so a method runs on every backbone a Dassl user names."""
    from dassl.modeling import build_backbone

    register_timm_backbone(name, weights_file, img_size)
    net = build_backbone(name, pretrained=pretrained)
    if not isinstance(getattr(net, "out_features", None), int):
        raise DAELConfigError(
            f"Dassl's backbone {name!r} gives no integer out_features (its feature size), which a method's "
            "heads are sized from; use a backbone that sets it"
        )
    return net
