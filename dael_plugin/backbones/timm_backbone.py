"""Any timm model as a feature extractor (``MODEL.BACKBONE.NAME: timm_<model>``)."""

from __future__ import annotations

import difflib
import os
import socket
from typing import Dict, Optional, Sequence, Tuple
from urllib.parse import urlparse

from torch import nn

from dael_plugin.errors import DAELConfigError

PREFIX = "timm_"
# timm model -> "cache" or "hub": where this process's builds found its pretrained weights.
_SOURCES: Dict[str, str] = {}


def weights_source(model_name: str) -> Optional[str]:
    """``cache`` or ``hub`` where a build in this process read ``model_name``'s pretrained weights
    from a local cache or downloaded them; None where none did."""
    return _SOURCES.get(model_name)


def timm_model_name(backbone_name: str) -> str:
    return backbone_name[len(PREFIX) :] if backbone_name.startswith(PREFIX) else backbone_name


def check_timm_model(model_name: str) -> None:
    """A one-line error, with close names, if timm has no such model or no such weights tag
    (``timm_<model>.<tag>``: timm itself refuses an unknown tag with a RuntimeError at build time,
    after the data was read, even with PRETRAINED False)."""
    import timm

    arch, _, tag = model_name.partition(".")
    if not timm.is_model(arch):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3)
        hint = f" (did you mean {', '.join(PREFIX + c for c in close)}?)" if close else ""
        raise DAELConfigError(f"MODEL.BACKBONE.NAME={PREFIX}{model_name}: timm has no model {model_name!r}{hint}")
    tags = [t.partition(".")[2] for t in timm.list_pretrained(f"{arch}.*")]
    if tag and tag not in tags:
        close = difflib.get_close_matches(tag, tags, n=1)
        hint = f"did you mean {PREFIX}{arch}.{close[0]}? " if close else ""
        known = f"its tags: {', '.join(tags)}" if tags else f"it has none; use {PREFIX}{arch}"
        raise DAELConfigError(
            f"MODEL.BACKBONE.NAME={PREFIX}{model_name}: timm has no weights tag {tag!r} for {arch} ({hint}{known})"
        )


def check_timm_backbone(backbone_name: str) -> None:
    """For ``timm_<model>`` names, :func:`check_timm_model`; other names pass."""
    if backbone_name.startswith(PREFIX):
        check_timm_model(timm_model_name(backbone_name))


def cached_weights_file(model_name: str) -> Optional[str]:
    """The file of timm's pretrained weights for ``model_name`` on this machine (the Hugging Face
    cache or the torch hub cache), or None: not there, or timm names no source."""
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
            found = try_to_load_from_cache(repo, fname) if fname else None
            if isinstance(found, str):
                return found
        return None
    if getattr(pcfg, "url", None):
        import torch

        path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(pcfg.url))
        return path if os.path.isfile(path) else None
    return None


def _weights_cached(model_name: str) -> Optional[bool]:
    """Whether timm's pretrained file for ``model_name`` is already on disk; None when timm
    names no source."""
    import timm

    try:
        pcfg = timm.models.get_pretrained_cfg(model_name)
    except Exception:  # an unknown tag: let timm say so
        return None
    if pcfg is None or not (getattr(pcfg, "hf_hub_id", None) or getattr(pcfg, "url", None)):
        return None
    return cached_weights_file(model_name) is not None


def host_resolves(url: str) -> bool:
    """Whether the host of ``url`` has an address (one lookup, no connection)."""
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
        offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))  # read when the hub library was imported
        expected = f"{pcfg.hf_hub_id.split('@')[0]}/model.safetensors (or pytorch_model.bin)"
        searched = f"the Hugging Face cache {constants.HF_HUB_CACHE}"
    else:
        import torch

        url, offline = pcfg.url, False
        expected = os.path.basename(pcfg.url)
        searched = f"the torch hub cache {os.path.join(torch.hub.get_dir(), 'checkpoints')}"
    if offline or not host_resolves(url):
        why = "HF_HUB_OFFLINE is set" if offline else f"{url} cannot be reached"
        raise DAELConfigError(
            f"pretrained weights for timm model {model_name!r} ({expected}) are not in {searched} and {why}; "
            "give a local file with MODEL.BACKBONE.WEIGHTS /path/to/weights.pth (or .safetensors), put them in "
            "that cache, or set MODEL.BACKBONE.PRETRAINED False"
        )


def made_for(model_name: str) -> Optional[Tuple[int, int]]:
    """The (height, width) timm's pretrained config says the model was made for, or None."""
    import timm

    try:
        pcfg = timm.models.get_pretrained_cfg(model_name)
    except Exception:  # noqa: BLE001 (an unknown tag: timm says so when it builds)
        return None
    size = getattr(pcfg, "input_size", None) if pcfg is not None else None
    return (int(size[-2]), int(size[-1])) if size else None


def create_at_size(model_name: str, pretrained: bool, img_size: Optional[Sequence[int]], **kwargs) -> nn.Module:
    """``timm.create_model(..., num_classes=0)`` for images of ``img_size``: a model that takes the
    size as an argument (ViT, DeiT, Swin, EVA, CLIP towers) is built for it, timm resampling its
    pretrained position embeddings; a convolutional one (no such argument) takes any size as it is.
    Then one blank image of that size goes through it (evaluation mode, no gradient): a model that
    cannot take the size is one line naming the size it was made for."""
    import timm
    import torch

    model = None
    if img_size is not None:
        try:
            model = timm.create_model(
                model_name, pretrained=pretrained, num_classes=0, img_size=tuple(int(v) for v in img_size), **kwargs
            )
        except TypeError as exc:
            if "img_size" not in str(exc):
                raise
    if model is None:
        model = timm.create_model(model_name, pretrained=pretrained, num_classes=0, **kwargs)
    if img_size is None:
        return model
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, *[int(v) for v in img_size]))
    except Exception as exc:  # noqa: BLE001 (an assertion, a shape error: the model's own words)
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        made = made_for(model_name)
        hint = f'; it was made for {made[0]}x{made[1]}: set INPUT.SIZE "{list(made)}"' if made else ""
        raise DAELConfigError(
            f"MODEL.BACKBONE.NAME={PREFIX}{model_name} does not take INPUT.SIZE {img_size[0]}x{img_size[1]} "
            f"({type(exc).__name__}: {said}){hint}, or pick another model"
        ) from None
    finally:
        model.train(was)
    check_whole_patches(model, model_name, [int(v) for v in img_size])
    return model


def check_whole_patches(model: nn.Module, model_name: str, size: Sequence[int]) -> None:
    """One line where ``size`` is not a multiple of the model's patch size: timm's patch embedding
    (without ``dynamic_img_pad``) reads the whole patches and drops the rest of every image without a
    word (a ViT/16 at 30x30 reads its top-left 16x16 pixels: the others change no output)."""
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if patch is None or getattr(embed, "dynamic_img_pad", False):
        return
    patch = tuple(int(p) for p in patch) if isinstance(patch, (tuple, list)) else (int(patch),) * 2
    if all(s % p == 0 for s, p in zip(size, patch)):
        return
    read = [s // p * p for s, p in zip(size, patch)]
    fit = [max(p, round(s / p) * p) for s, p in zip(size, patch)]
    raise DAELConfigError(
        f"MODEL.BACKBONE.NAME={PREFIX}{model_name} at INPUT.SIZE {size[0]}x{size[1]}: not a multiple of its "
        f"{patch[0]}x{patch[1]} patches, so it would read the top-left {read[0]}x{read[1]} pixels of each image "
        f'and drop the rest; set INPUT.SIZE "{fit}"'
    )


class TimmBackbone(nn.Module):
    """Wraps ``timm.create_model(name, num_classes=0)``: pooled features only.

    ``out_features`` is read from the model (``head_hidden_size``, else
    ``num_features``), never hard-coded. Weights: ``weights_file``, whenever given, is read
    strictly (``backbones.weights``: every key filled, known prefixes stripped); otherwise
    ``pretrained=True`` loads timm's own cache, and ``pretrained=False`` builds a random model.
    ``img_size``: the images' (height, width) (``INPUT.SIZE``), see :func:`create_at_size`.
    """

    def __init__(
        self,
        model_name: str,
        pretrained: bool = False,
        weights_file: str = "",
        img_size: Optional[Sequence[int]] = None,
        **kwargs,
    ) -> None:
        super().__init__()
        check_timm_model(model_name)
        if weights_file and not os.path.isfile(weights_file):
            raise DAELConfigError(f"MODEL.BACKBONE.WEIGHTS={weights_file!r} is not a file")
        # A file is read whenever it is given, strictly, by backbones/weights.py (timm's overlay
        # loads non-strictly with num_classes=0: another model's keys where they fit, or none)
        from_hub = pretrained and not weights_file
        cached = None
        if from_hub:
            check_pretrained_reachable(model_name)
            cached = cached_weights_file(model_name)
        try:
            self.model = create_at_size(model_name, from_hub, img_size, **kwargs)
        except DAELConfigError:
            raise
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
        elif from_hub:  # for the record: found in a cache, or downloaded by this build
            _SOURCES[model_name] = "cache" if cached else "hub"
        self.model_name = model_name
        # With num_classes=0 the model returns its pre-logits features: for most
        # models that is num_features, but models with a head conv (MobileNetV3,
        # EfficientNet-style heads) return head_hidden_size.
        self.out_features = int(getattr(self.model, "head_hidden_size", None) or self.model.num_features)

    def forward(self, x):
        return self.model(x)
