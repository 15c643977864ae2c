"""Why AUG_ON_DEVICE is plain PyTorch: the candidates timed on one batch.

For a batch of uint8 images, each way of making a strong view with
*per-sample* random operations:

- dael_plugin (``dael_plugin.transforms.ops``): RandAugment drawn per sample,
  every operation vectorised over the batch;
- torchvision v2 ``RandAugment`` on tensors: one draw per call, so per-sample
  draws need a Python loop over the images;
- kornia (when installed): its per-sample functional operations that
  ``dael_plugin.transforms.ops`` would otherwise call (``warp_affine``, ``sharpness``,
  ``equalize``) against ours, and its ``RandAugment`` module (one draw of
  operations per batch, so not per-sample; shown for scale).

NVIDIA DALI is not timed: it runs only on a GPU, and the views must also be
made on CPU. Run on the device to choose for: ``--device cuda``.
"""

import argparse
import statistics
import time

import torch


def timeit(fn, device, repeats=5):
    fn()
    ts = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = p.parse_args()
    dev = torch.device(args.device)
    from torchvision.transforms import v2

    from dael_plugin.transforms import ops as ad

    b, s = args.batch, args.size
    u8 = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, device=dev)
    x = u8.float() / 255
    print(f"{b} images {s}x{s} on {dev} ({torch.get_num_threads()} CPU threads), median ms")
    ours = ad.RandAugmentBatch(ad.TV_LIST, 2, 1.0, ad._tv(9))
    print(f"  dael_plugin RandAugment, per-sample draws, batched   {timeit(lambda: ours(x), dev):8.1f}")
    tv = v2.RandAugment(num_ops=2, magnitude=9)
    print(f"  torchvision v2 RandAugment, looped per image         {timeit(lambda: [tv(i) for i in u8], dev):8.1f}")
    print(f"  torchvision v2 RandAugment, one draw for the batch   {timeit(lambda: tv(u8), dev):8.1f}")
    v = torch.rand(b, device=dev) + 0.5
    inv = ad._geometric_inverse("Rotate", torch.rand(b, device=dev) * 30, s, s)
    ops = [
        ("affine warp", lambda: ad._warp(x, inv)),
        ("sharpness", lambda: ad._blend(ad._sharpen_base(x), x, v)),
        ("equalize", lambda: ad._equalize(x)),
    ]
    try:
        import kornia
        from kornia.augmentation.auto import RandAugment as KRandAugment
    except ImportError:
        kornia = None
        print("  (kornia not installed: pip install kornia to compare)")
    for name, fn in ops:
        line = f"  {name:<12} dael_plugin {timeit(fn, dev):8.1f}"
        if kornia is not None:
            if name == "affine warp":
                full = torch.cat([inv.view(b, 2, 3), torch.tensor([0.0, 0.0, 1.0], device=dev).expand(b, 1, 3)], 1)
                fwd = torch.linalg.inv(full)[:, :2]
                kfn = lambda: kornia.geometry.transform.warp_affine(x, fwd, (s, s))  # noqa: E731
            elif name == "sharpness":
                kfn = lambda: kornia.enhance.sharpness(x, v)  # noqa: E731
            else:
                kfn = lambda: kornia.enhance.equalize(x)  # noqa: E731
            line += f"   kornia {timeit(kfn, dev):8.1f}"
        print(line)
    if kornia is not None:
        kra = KRandAugment(n=2, m=9).to(dev)
        print(f"  kornia RandAugment module (one draw of ops per batch)  {timeit(lambda: kra(x), dev):8.1f}")


if __name__ == "__main__":
    main()
