"""``MODEL.BACKBONE.WEIGHTS``: a local weights file read into the backbone whenever it is given,
strictly, and recorded.

timm's own loading (``pretrained_cfg_overlay``) is non-strict with ``num_classes=0``: another
model's state dict loaded where keys fit (resnet34's into resnet18), and a file whose keys carry a
prefix (``backbone.``, ``encoder.``, a DAEL checkpoint's ``F.``) loaded no key at all, each with
timm's "Unexpected keys ... This may be expected" alone. Here the file must fill every one of the
backbone's parameters and buffers with the right shape; a known prefix is stripped and named; the
keys the backbone lacks are refused too, except a classifier's (``fc.``, ``head.``, ...) that
``num_classes=0`` removed. Loads are ``weights_only=True``, to the CPU.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Sequence, Tuple

import torch
from torch import nn

from dael_plugin.errors import DAELConfigError

# Prefixes a backbone's keys carry in other files: DDP's, a wrapper's, a DAEL checkpoint's F.
PREFIXES = ("", "module.", "backbone.", "encoder.", "model.", "F.", "F.model.", "module.backbone.", "module.model.")
# Keys a timm model built with num_classes=0 lacks: its ImageNet classifier.
CLASSIFIER_PREFIXES = ("fc.", "head.", "head.fc.", "classifier.", "last_linear.", "heads.", "_fc.")


_HASHED: Dict[Tuple[str, int, int], str] = {}  # (real path, size, mtime) -> sha256, for this process


def sha256_of(path: str) -> str:
    """The file's sha256, read once per process while its size and modification time stay (a
    ViT-B's 350 MB are hashed for the record and each checkpoint, about a second each time)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = _sha256(path)
    return _HASHED[key]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_state(path: str) -> Dict[str, torch.Tensor]:
    """A state dict from a ``.safetensors`` file or a torch file (a plain state dict, or one under
    ``state_dict`` / ``model``), to the CPU; every failure is one line naming the file."""
    if not os.path.isfile(path):
        raise DAELConfigError(f"MODEL.BACKBONE.WEIGHTS={path!r} is not a file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path, device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (pickle, zip, safetensors: many kinds)
        raise DAELConfigError(
            f"MODEL.BACKBONE.WEIGHTS {path} cannot be read as weights ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise DAELConfigError(f"MODEL.BACKBONE.WEIGHTS {path} holds no state dict of tensors")
    return state


def _fit(own: Dict[str, torch.Tensor], state: Dict[str, torch.Tensor]) -> Tuple[str, Dict[str, torch.Tensor]]:
    """The prefix under which ``state`` covers most of ``own``, and the stripped sub-dict."""
    best: Tuple[int, str, Dict[str, torch.Tensor]] = (-1, "", {})
    for prefix in PREFIXES:
        sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        hits = len(set(sub) & set(own))
        if hits > best[0]:
            best = (hits, prefix, sub)
    return best[1], best[2]


def load_backbone_weights(module: nn.Module, path: str, allowed_extra: Sequence[str] = CLASSIFIER_PREFIXES) -> dict:
    """Read ``path`` into ``module`` key for key (:data:`PREFIXES` stripped); one line where it does
    not fill every key, holds keys the module lacks (other than ``allowed_extra``), or a shape
    differs. Returns the record: file, sha256, the prefix stripped, the keys left out."""
    state = read_state(path)
    own = module.state_dict()
    prefix, sub = _fit(own, state)
    missing = sorted(set(own) - set(sub))
    extra = sorted(k for k in set(sub) - set(own) if not k.startswith(tuple(allowed_extra)))
    wrong = [k for k in own if k in sub and tuple(sub[k].shape) != tuple(own[k].shape)]
    where = f" (prefix {prefix!r} stripped)" if prefix else ""
    resampled = []
    if wrong and not missing:
        sub, resampled = _resample_to(module, sub, wrong)
        wrong = [k for k in own if k in sub and tuple(sub[k].shape) != tuple(own[k].shape)]
    if missing:
        raise DAELConfigError(
            f"MODEL.BACKBONE.WEIGHTS {path}{where} fills {len(own) - len(missing)} of the backbone's {len(own)} "
            f"keys: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} missing; give this backbone's own weights"
        )
    if wrong:
        k = wrong[0]
        raise DAELConfigError(
            f"MODEL.BACKBONE.WEIGHTS {path}{where}: {k} is {tuple(sub[k].shape)}, the backbone's "
            f"{tuple(own[k].shape)} (another model's weights?)"
        )
    if extra:
        raise DAELConfigError(
            f"MODEL.BACKBONE.WEIGHTS {path}{where} holds {len(extra)} keys this backbone lacks "
            f"({', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}): another model's weights?"
        )
    module.load_state_dict({k: sub[k] for k in own})
    left = len(state) - len(own)
    print(
        f"Loaded the backbone's weights from {path}{where}: every one of its {len(own)} keys"
        + (f"; {left} other keys of the file left out (its classifier, other modules)" if left else "")
        + (f"; resampled to this input size, as timm does: {', '.join(resampled)}" if resampled else "")
    )
    record = {"file": os.path.abspath(path), "sha256": sha256_of(path), "prefix": prefix, "keys": len(own)}
    if resampled:
        record["resampled"] = resampled
    return record


def _resample_to(module: nn.Module, sub: Dict[str, torch.Tensor], wrong: Sequence[str]):
    """A ViT-like timm model's weights for another input size (position embeddings, patch
    embedding) through the model family's own ``checkpoint_filter_fn``, as timm's pretrained
    loading does; ``(sub, [])`` unchanged where the family has none or it fails."""
    import sys

    timm_model = next((m for m in module.modules() if type(m).__module__.startswith("timm.models.")), None)
    fn = getattr(sys.modules.get(type(timm_model).__module__), "checkpoint_filter_fn", None) if timm_model else None
    if fn is None:
        return sub, []
    prefix = next((n + "." for n, m in module.named_modules() if m is timm_model and n), "")
    inner = {k[len(prefix) :]: v for k, v in sub.items() if k.startswith(prefix)}
    try:
        filtered = fn(dict(inner), timm_model)
    except Exception:  # noqa: BLE001 (a family's filter for another layout: the shape error is said)
        return sub, []
    out = {**sub, **{prefix + k: v for k, v in filtered.items()}}
    return out, [k for k in wrong if k in out and out[k].shape != sub[k].shape]
