"""Backbones in Dassl's ``BACKBONE_REGISTRY``: the plugin's own, and any timm model as
``timm_<model>`` (made on first use, so Dassl's ``build_backbone`` takes every name timm knows)."""

from __future__ import annotations

from dassl.modeling.backbone import BACKBONE_REGISTRY

from dael_plugin.backbones import (
    OWN_BACKBONES,
    TIMM_PREFIX,
    TimmBackbone,
    timm_model_name,
)


def register_own_backbones() -> None:
    for name, cls in OWN_BACKBONES.items():
        if name not in BACKBONE_REGISTRY.registered_names():
            BACKBONE_REGISTRY._do_register(name, _own_factory(cls))  # keyed by our name


class _TimmAwareNames(list):
    """Dassl's ``check_availability`` asks ``name in registered_names()``: any
    ``timm_<model>`` that timm knows is available, without listing them all."""

    def __contains__(self, name) -> bool:
        return list.__contains__(self, name) or _timm_known(name)


class _TimmAwareMap(dict):
    """The registry's name -> factory map; ``timm_<model>`` factories are made on first use."""

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or _timm_known(name)

    def __getitem__(self, name):
        if not dict.__contains__(self, name) and _timm_known(name):
            dict.__setitem__(self, name, _timm_factory(name, ""))
        return dict.__getitem__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default


def _timm_known(name) -> bool:
    if not isinstance(name, str) or not name.startswith(TIMM_PREFIX):
        return False
    import timm

    return timm.is_model(timm_model_name(name).split(".")[0])


def make_timm_names_lazy() -> None:
    """After ``import dael_plugin``, Dassl's own ``build_backbone("timm_<model>")``
    works from any script, for every model timm has."""
    import types

    if not isinstance(BACKBONE_REGISTRY._obj_map, _TimmAwareMap):
        BACKBONE_REGISTRY._obj_map = _TimmAwareMap(BACKBONE_REGISTRY._obj_map)
        BACKBONE_REGISTRY.registered_names = types.MethodType(
            lambda self: _TimmAwareNames(self._obj_map.keys()), BACKBONE_REGISTRY
        )


def _timm_factory(name: str, weights_file: str):
    def factory(pretrained=True, **kwargs):
        kwargs.pop("verbose", None)
        return TimmBackbone(
            timm_model_name(name), pretrained=pretrained, weights_file=kwargs.pop("weights_file", weights_file)
        )

    factory.__name__ = name
    return factory


def _own_factory(cls):
    def factory(pretrained=False, **kwargs):
        return cls()

    factory.__name__ = getattr(cls, "__name__", "backbone")
    return factory


def register_timm_backbone(name: str, weights_file: str = "") -> None:
    """Make ``timm_<model>`` buildable by Dassl's ``build_backbone``.

    Dassl passes only ``pretrained`` to a factory, so the timm model name and
    the local weights file are carried by the registered closure.
    """
    if not name.startswith(TIMM_PREFIX):
        return
    BACKBONE_REGISTRY._do_register(name, _timm_factory(name, weights_file), force=True)
