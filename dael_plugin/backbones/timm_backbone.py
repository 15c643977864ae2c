"""Any timm model as a feature extractor (``MODEL.BACKBONE.NAME: timm_<model>``)."""

from __future__ import annotations

import difflib
import os
import socket
from typing import Optional
from urllib.parse import urlparse

from torch import nn

from dael_plugin.errors import DAELConfigError

PREFIX = "timm_"


def timm_model_name(backbone_name: str) -> str:
    return backbone_name[len(PREFIX) :] if backbone_name.startswith(PREFIX) else backbone_name


def check_timm_model(model_name: str) -> None:
    """A one-line error, with close names, if timm has no such model."""
    import timm

    if not timm.is_model(model_name.split(".")[0]):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3)
        hint = f" (did you mean {', '.join(PREFIX + c for c in close)}?)" if close else ""
        raise DAELConfigError(f"MODEL.BACKBONE.NAME={PREFIX}{model_name}: timm has no model {model_name!r}{hint}")


def check_timm_backbone(backbone_name: str) -> None:
    """For ``timm_<model>`` names, :func:`check_timm_model`; other names pass."""
    if backbone_name.startswith(PREFIX):
        check_timm_model(timm_model_name(backbone_name))


def _weights_cached(model_name: str) -> Optional[bool]:
    """Whether timm's pretrained file for ``model_name`` is already on disk
    (Hugging Face cache or torch hub cache); None when timm names no source."""
    import timm

    try:
        pcfg = timm.models.get_pretrained_cfg(model_name)
    except Exception:  # an unknown tag: let timm say so
        return None
    if pcfg is None:
        return None
    if getattr(pcfg, "hf_hub_id", None):
        from huggingface_hub import try_to_load_from_cache

        repo = pcfg.hf_hub_id.split("@")[0]
        for fname in ("model.safetensors", "pytorch_model.bin", getattr(pcfg, "hf_hub_filename", None)):
            if fname and isinstance(try_to_load_from_cache(repo, fname), str):
                return True
        return False
    if getattr(pcfg, "url", None):
        import torch

        return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(pcfg.url)))
    return None


def _host_resolves(url: str) -> bool:
    host = urlparse(url).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def check_pretrained_reachable(model_name: str) -> None:
    """Fail in seconds, not after the hub client's retries, when weights are neither
    cached nor downloadable: one lookup of the weights' host, no connection."""
    cached = _weights_cached(model_name)
    if cached is None or cached:
        return
    import timm

    pcfg = timm.models.get_pretrained_cfg(model_name)
    if getattr(pcfg, "hf_hub_id", None):
        from huggingface_hub import constants

        url = constants.ENDPOINT
        offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
    else:
        url, offline = pcfg.url, False
    if offline or not _host_resolves(url):
        raise DAELConfigError(
            f"pretrained weights for timm model {model_name!r} are not on this machine and {url} cannot be "
            "reached; give a local file with MODEL.BACKBONE.WEIGHTS /path/to/weights.pth (or .safetensors), "
            "put them in the Hugging Face cache, or set MODEL.BACKBONE.PRETRAINED False"
        )


class TimmBackbone(nn.Module):
    """Wraps ``timm.create_model(name, num_classes=0)``: pooled features only.

    ``out_features`` is read from the model (``head_hidden_size``, else
    ``num_features``), never hard-coded. Weights: ``weights_file``, whenever given, is read
    strictly (``backbones.weights``: every key filled, known prefixes stripped); otherwise
    ``pretrained=True`` loads timm's own cache, and ``pretrained=False`` builds a random model.
    """

    def __init__(self, model_name: str, pretrained: bool = False, weights_file: str = "", **kwargs) -> None:
        super().__init__()
        import timm

        check_timm_model(model_name)
        if weights_file and not os.path.isfile(weights_file):
            raise DAELConfigError(f"MODEL.BACKBONE.WEIGHTS={weights_file!r} is not a file")
        # A file is read whenever it is given, strictly, by backbones/weights.py (timm's overlay
        # loads non-strictly with num_classes=0: another model's keys where they fit, or none)
        from_hub = pretrained and not weights_file
        if from_hub:
            check_pretrained_reachable(model_name)
        try:
            self.model = timm.create_model(model_name, pretrained=from_hub, num_classes=0, **kwargs)
        except Exception as exc:  # timm raises many kinds when it cannot reach weights
            if not pretrained:
                raise
            raise DAELConfigError(
                f"could not load pretrained weights for timm model {model_name!r} ({type(exc).__name__}); "
                "give a local file with MODEL.BACKBONE.WEIGHTS /path/to/weights.pth, "
                "or set MODEL.BACKBONE.PRETRAINED False"
            ) from None
        if weights_file:
            from dael_plugin.backbones.weights import load_backbone_weights

            load_backbone_weights(self.model, weights_file)
        self.model_name = model_name
        # With num_classes=0 the model returns its pre-logits features: for most
        # models that is num_features, but models with a head conv (MobileNetV3,
        # EfficientNet-style heads) return head_hidden_size.
        self.out_features = int(getattr(self.model, "head_hidden_size", None) or self.model.num_features)

    def forward(self, x):
        return self.model(x)
