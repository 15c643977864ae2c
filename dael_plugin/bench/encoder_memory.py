"""What a DAEL step on an encoder keeps for its backward pass, estimated on the CPU before a GPU is
asked: the activations autograd saves per image (``engine/memory.py::saved_activation_bytes``, the
estimate the run's step-memory check refuses with, on two and four images: what each image adds),
times the images a step passes with gradients (the source weak and strong views and the target's
strong view; the target's weak view runs without), plus the weights, their gradients and AdamW's two
moments. On the H200 this estimate was a floor (ResNet-18, fp32: 248.8 MiB estimated, 256.0 held).

python -m dael_plugin.bench.encoder_memory [--size 224] [NAME ...]
"""

from __future__ import annotations

import argparse

import torch

from dael_plugin.backbones import build_backbone
from dael_plugin.engine.memory import saved_activation_bytes

# The shipped encoder configs: (backbone, source batch, target batch: 0 for DG)
SHIPPED = {
    "mini_domainnet_vit_small (DAEL)": ("timm_vit_small_patch16_224.augreg_in21k_ft_in1k", 192, 64),
    "mini_domainnet_clip_vit_b16 (DAEL)": ("timm_vit_base_patch16_clip_quickgelu_224.openai", 96, 32),
    "pacs_vit_small (DAELDG)": ("timm_vit_small_patch16_224.augreg_in21k_ft_in1k", 96, 0),
    "pacs_clip_vit_b16 (DAELDG)": ("timm_vit_base_patch16_clip_quickgelu_224.openai", 96, 0),
}


def per_image(name: str, size: int, prec: str) -> tuple:
    """(bytes each image adds, parameter count) for ``name`` at ``size`` in ``prec``, in training mode."""
    torch.manual_seed(0)
    net = build_backbone(name, img_size=(size, size)).train()
    probe = torch.randn(4, 3, size, size)
    two, four = (saved_activation_bytes(net, probe[:n].clone(), prec) for n in (2, 4))
    return max(four - two, 0) / 2, sum(p.numel() for p in net.parameters())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args(argv)
    cache = {}
    print(f"{'config':<38} {'prec':<5} {'MiB/image':>10} {'images':>7} {'weights+grads+AdamW':>20} {'GiB':>6}")
    for label, (name, bx, bu) in SHIPPED.items():
        for prec in ("fp32", "bf16"):
            if (name, prec) not in cache:
                cache[(name, prec)] = per_image(name, args.size, prec)
            each, params = cache[(name, prec)]
            images = 2 * bx + bu
            states = params * 4 * 4  # fp32 weights, gradients and AdamW's two moments
            total = each * images + states
            print(
                f"{label:<38} {prec:<5} {each / 2**20:>10.1f} {images:>7d} {states / 2**30:>19.2f}G "
                f"{total / 2**30:>6.1f}"
            )


if __name__ == "__main__":
    main()
