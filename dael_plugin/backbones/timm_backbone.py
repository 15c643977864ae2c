"""Any timm model as a feature extractor (``MODEL.BACKBONE.NAME: timm_<model>``)."""
from __future__ import annotations

import difflib
import os

from torch import nn

from ..errors import DAELConfigError

PREFIX = "timm_"


def timm_model_name(backbone_name: str) -> str:
    return backbone_name[len(PREFIX):] if backbone_name.startswith(PREFIX) else backbone_name


def check_timm_model(model_name: str) -> None:
    """A one-line error, with close names, if timm has no such model."""
    import timm

    if not timm.is_model(model_name):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3)
        hint = f" (did you mean {', '.join(PREFIX + c for c in close)}?)" if close else ""
        raise DAELConfigError(f"MODEL.BACKBONE.NAME={PREFIX}{model_name}: timm has no model {model_name!r}{hint}")


def check_timm_backbone(backbone_name: str) -> None:
    """For ``timm_<model>`` names, :func:`check_timm_model`; other names pass."""
    if backbone_name.startswith(PREFIX):
        check_timm_model(timm_model_name(backbone_name))


class TimmBackbone(nn.Module):
    """Wraps ``timm.create_model(name, num_classes=0)``: pooled features only.

    ``out_features`` is read from the model's ``num_features``, never
    hard-coded. Weights: ``pretrained=False`` builds a random model;
    ``pretrained=True`` loads ``weights_file`` if given (a local state dict,
    through timm's ``pretrained_cfg_overlay``), otherwise timm's own cache.
    """

    def __init__(self, model_name: str, pretrained: bool = False, weights_file: str = "", **kwargs) -> None:
        super().__init__()
        import timm

        check_timm_model(model_name)
        if weights_file and not os.path.isfile(weights_file):
            raise DAELConfigError(f"MODEL.BACKBONE.WEIGHTS={weights_file!r} is not a file")
        overlay = {"file": os.path.abspath(weights_file)} if (pretrained and weights_file) else None
        try:
            self.model = timm.create_model(
                model_name, pretrained=pretrained, num_classes=0, pretrained_cfg_overlay=overlay, **kwargs
            )
        except Exception as exc:  # timm raises many kinds when it cannot reach weights
            if not pretrained:
                raise
            raise DAELConfigError(
                f"could not load pretrained weights for timm model {model_name!r} ({type(exc).__name__}); "
                "give a local file with MODEL.BACKBONE.WEIGHTS /path/to/weights.pth, "
                "or set MODEL.BACKBONE.PRETRAINED False"
            ) from None
        self.model_name = model_name
        self.out_features = int(self.model.num_features)

    def forward(self, x):
        return self.model(x)
