"""Any ``timm_<model>`` resolves in Dassl's ``BACKBONE_REGISTRY``, from any script, after
``import dael_plugin``: Dassl's own ``tools/train.py`` builds ``build_backbone(cfg.MODEL.BACKBONE.NAME)``
for its own trainers (M3SDA, MME, ...) without the plugin seeing the config first.

Why a private hook: Dassl's ``Registry`` (``dassl/utils/registry.py``) has ``register``, ``get`` and
``registered_names`` and nothing else; ``get`` reads ``_obj_map`` and ``check_availability`` asks
``name in registered_names()``. Registering every timm model up front would make about 1200
factories and import timm at ``import dael_plugin``. So the map and the names list are replaced,
once, by ones that know a ``timm_<model>`` name when timm does and make its factory on first use.
Nothing else touches Dassl's private state; the plugin's own backbones and a run's named timm
backbone go through the public ``register`` (:mod:`dael_plugin.dassl_adapter.backbones`).
"""

from __future__ import annotations

from dassl.modeling.backbone import BACKBONE_REGISTRY

from dael_plugin.backbones import TIMM_PREFIX, timm_model_name
from dael_plugin.dassl_adapter.backbones import timm_factory


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
            dict.__setitem__(self, name, timm_factory(name, ""))
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
