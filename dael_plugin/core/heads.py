"""Classifier heads over shared features (paper, Sec. 3 "Model")."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F


class ExpertHeads(nn.Module):
    """K linear classifiers ("experts") over one shared feature vector.

    All experts run as a single matrix multiply: the K weight matrices are
    stored stacked, so ``forward`` costs one GEMM whatever K is.

    Args:
        in_features: feature size produced by the backbone.
        num_classes: number of classes C.
        num_experts: number of experts K (one per source domain, or 1 for
            the "single classifier" ablation of Table 3b).

    Shapes:
        forward: ``(B, in_features) -> (B, K, C)`` logits.
    """

    def __init__(self, in_features: int, num_classes: int, num_experts: int) -> None:
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        self.in_features = in_features
        self.num_classes = num_classes
        self.num_experts = num_experts
        self.weight = nn.Parameter(torch.empty(num_experts, num_classes, in_features))
        self.bias = nn.Parameter(torch.empty(num_experts, num_classes))
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(_stack_linears)

    def reset_parameters(self) -> None:
        # Same initialisation as K independent nn.Linear layers.
        for k in range(self.num_experts):
            nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        k, c, d = self.weight.shape
        logits = F.linear(features, self.weight.reshape(k * c, d), self.bias.reshape(k * c))
        return logits.view(features.shape[0], k, c)

    @torch.no_grad()
    def load_from_linears(self, linears: Sequence[nn.Linear]) -> "ExpertHeads":
        """Copy weights from K separate ``nn.Linear`` layers (e.g. Dassl's ``Experts``)."""
        if len(linears) != self.num_experts:
            raise ValueError(f"expected {self.num_experts} linear layers, got {len(linears)}")
        for k, lin in enumerate(linears):
            self.weight[k].copy_(lin.weight)
            self.bias[k].copy_(lin.bias)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}, num_experts={self.num_experts}"


def _stack_linears(state_dict, prefix, *args) -> None:
    """Accept the K-separate-linears layout (Dassl's ``Experts``: ``linears.k.weight``).

    Checkpoints of Dassl's own DAEL store each expert as ``linears.<k>.weight``
    and ``linears.<k>.bias``; they are stacked into this module's
    ``weight`` (K, C, D) and ``bias`` (K, C) as they load.
    """
    keys = [k for k in state_dict if k.startswith(prefix + "linears.")]
    if not keys or (prefix + "weight") in state_dict:
        return
    ks = sorted({int(k[len(prefix) + len("linears.") :].split(".")[0]) for k in keys})
    weights = [state_dict.pop(f"{prefix}linears.{k}.weight") for k in ks]
    biases = [state_dict.pop(f"{prefix}linears.{k}.bias") for k in ks]
    state_dict[prefix + "weight"] = torch.stack(weights)
    state_dict[prefix + "bias"] = torch.stack(biases)
