"""Views made on the device (AUG_ON_DEVICE), on CPU: each operation against PIL,
per-sample draws, independent views, and whole runs on both engines."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms import device as views_mod
from dael_plugin.transforms import ops as ad


def _images(b=6, h=24, w=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(30, 200, (b, 3, 1, 1), generator=g)
    noise = torch.randint(-30, 30, (b, 3, h, w), generator=g)
    ramp = torch.linspace(0, 50, w).view(1, 1, 1, w)
    return (base + noise + ramp).clamp(0, 255).to(torch.uint8)


def _pil(t):
    return Image.fromarray(t.permute(1, 2, 0).numpy())


def _back(img):
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255


@pytest.mark.parametrize(
    "name,pil_op,value",
    [
        ("Equalize", ImageOps.equalize, None),
        ("AutoContrast", ImageOps.autocontrast, None),
        ("Invert", ImageOps.invert, None),
        ("Posterize", lambda im, v: ImageOps.posterize(im, int(v)), 5.0),
        ("Solarize", lambda im, v: ImageOps.solarize(im, int(v * 255)), 120 / 255),
        ("Brightness", lambda im, v: ImageEnhance.Brightness(im).enhance(v), 1.6),
        ("Color", lambda im, v: ImageEnhance.Color(im).enhance(v), 0.3),
        ("Contrast", lambda im, v: ImageEnhance.Contrast(im).enhance(v), 1.7),
        ("Sharpness", lambda im, v: ImageEnhance.Sharpness(im).enhance(v), 1.9),
    ],
)
def test_colour_operations_match_pil(name, pil_op, value):
    imgs = _images()
    x = imgs.float() / 255
    v = torch.full((x.shape[0],), value if value is not None else 0.0)
    ours = ad._colour_op(name, x, v)
    ref = torch.stack([_back(pil_op(_pil(t)) if value is None else pil_op(_pil(t), value)) for t in imgs])
    # PIL works in 8-bit integers: at most a couple of levels apart (one for the exact ones).
    tol = 1.01 / 255 if name in ("Equalize", "Invert", "Posterize", "Solarize", "AutoContrast") else 2.01 / 255
    assert (ours - ref).abs().max().item() <= tol, name


@pytest.mark.parametrize(
    "name,pil_args",
    [
        ("TranslateXabs", (1, 0, 3, 0, 1, 0)),
        ("TranslateYabs", (1, 0, 0, 0, 1, -4)),
        ("ShearX", (1, 0.25, 0, 0, 1, 0)),
    ],
)
def test_geometric_operations_follow_pils_affine_convention(name, pil_args):
    imgs = _images(b=3, h=20, w=20)
    x = imgs.float() / 255
    v = {"TranslateXabs": 3.0, "TranslateYabs": -4.0, "ShearX": 0.25}[name]
    inv = ad._geometric_inverse(name, torch.full((3,), v), 20, 20)
    ours = ad._warp(x, inv)
    ref = torch.stack(
        [_back(_pil(t).transform((20, 20), Image.AFFINE, pil_args, resample=Image.BILINEAR)) for t in imgs]
    )
    inner = (slice(None), slice(None), slice(2, -2), slice(5, -5))  # away from the uncovered border
    assert (ours - ref)[inner].abs().mean().item() < 2 / 255


def test_rotation_by_90_degrees_is_pils():
    imgs = _images(b=2, h=16, w=16)
    inv = ad._geometric_inverse("Rotate", torch.full((2,), 90.0), 16, 16)
    ours = ad._warp(imgs.float() / 255, inv)
    ref = torch.stack([_back(_pil(t).rotate(90)) for t in imgs])
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name,v,pil",
    [
        (
            "TranslateXabs",
            3.0,
            lambda im: im.transform((20, 20), Image.AFFINE, (1, 0, 3, 0, 1, 0), resample=Image.BILINEAR),
        ),
        (
            "TranslateYabs",
            -4.0,
            lambda im: im.transform((20, 20), Image.AFFINE, (1, 0, 0, 0, 1, -4), resample=Image.BILINEAR),
        ),
        (
            "ShearX",
            0.25,
            lambda im: im.transform((20, 20), Image.AFFINE, (1, 0.25, 0, 0, 1, 0), resample=Image.BILINEAR),
        ),
        ("Rotate", 90.0, lambda im: im.rotate(90)),
    ],
)
def test_the_policy_that_runs_warps_as_pil(name, v, pil):
    """Through ``RandAugmentBatch`` itself (what the views call: each slot's warp from its table
    of basis rows), one operation always applied at magnitude ``v``: PIL's image."""
    imgs = _images(b=3, h=20, w=20)
    policy = ad.RandAugmentBatch([(name, 0.0, 1.0)], 1, 1.0, lambda *_: (0.0, v, 0.0, False))
    ours = policy(imgs.float() / 255)
    ref = torch.stack([_back(pil(_pil(t))) for t in imgs])
    if name == "Rotate":  # a quarter turn maps pixels onto pixels: exact
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    else:
        inner = (slice(None), slice(None), slice(2, -2), slice(5, -5))  # away from the uncovered border
        assert (ours - ref)[inner].abs().mean().item() < 2 / 255


def test_draws_are_per_sample_and_the_views_independent():
    torch.manual_seed(0)
    same = _images(b=1).expand(64, -1, -1, -1).contiguous()
    policy = ad.RandAugmentBatch(ad.DASSL_LIST2, 2, 0.6, ad._dassl_uniform)
    out = policy(same.float() / 255)
    distinct = {tuple(o.flatten()[:50].mul(255).round().int().tolist()) for o in out}
    assert len(distinct) > 30  # one batch, many different operations and magnitudes
    unchanged = (out == same.float() / 255).flatten(1).all(1).float().mean().item()
    # Both slots skip (p 0.4 each) or draw Identity: about 0.4^2 + small; far from all or none.
    assert 0.05 < unchanged < 0.5


def test_flip_crop_cutout_are_per_sample():
    torch.manual_seed(0)
    x = _images(b=200, h=16, w=16).float() / 255
    flipped = ad._random_flip(x)
    is_flip = (flipped == x.flip(-1)).flatten(1).all(1)
    is_same = (flipped == x).flatten(1).all(1)
    assert bool((is_flip | is_same).all()) and 60 < int(is_flip.sum()) < 140
    cut = ad._cutout(x, 1, 8)
    zeroed = (cut == 0).all(1).flatten(1).sum(1)
    assert int(zeroed.max()) == 64 and len(set(zeroed.tolist())) > 3  # 8x8 squares, clipped at borders
    crop = ad._random_crop(x, 4)
    for i in range(5):  # each sample is its image shifted by whole pixels, zeros uncovered
        found = any(
            torch.allclose(crop[i], _int_shift(x[i], dx, dy), atol=1e-5) for dx in range(-4, 5) for dy in range(-4, 5)
        )
        assert found


def _int_shift(img, dx, dy):
    out = torch.zeros_like(img)
    h, w = img.shape[1:]
    ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
    ys2, xs2 = slice(max(0, dy), min(h, h + dy)), slice(max(0, dx), min(w, w + dx))
    out[:, ys, xs] = img[:, ys2, xs2]
    return out


def test_views_are_normalised_and_refuse_float_input():
    from yacs.config import CfgNode as CN

    inp = CN(
        {
            "PIXEL_MEAN": [0.5] * 3,
            "PIXEL_STD": [0.25] * 3,
            "RANDAUGMENT_N": 2,
            "RANDAUGMENT_M": 10,
            "CUTOUT_N": 1,
            "CUTOUT_LEN": 8,
            "CROP_PADDING": 4,
        }
    )
    views = views_mod.DeviceViews(["normalize"], ["random_flip", "cutout", "randaugment2", "normalize"], 2, inp, None)
    imgs = _images(b=8)
    weak, strong = views(imgs)
    torch.testing.assert_close(weak, (imgs.float() / 255 - 0.5) / 0.25)
    assert strong.shape == weak.shape and not torch.equal(strong, weak)
    with pytest.raises(ValueError, match="uint8"):
        views(imgs.float())


def test_unsupported_names_are_one_line():
    with pytest.raises(DAELConfigError, match="gaussian_blur.*AUG_ON_DEVICE cannot make"):
        views_mod.check_device_names(["normalize", "gaussian_blur"], "TRAINER.DAEL.STRONG_TRANSFORMS")


def test_a_builtin_run_with_views_on_the_device(tmp_path, tiny_root, capsys, monkeypatch):
    from dael_plugin.methods import dael as bt
    from test_hardening import args_for, cli

    seen = []
    real = bt.DAELBuiltin.forward_backward

    def spy(self, batch_x, batch_u):
        seen.append((batch_x["img"].dtype, "img2" in batch_x))
        return real(self, batch_x, batch_u)

    monkeypatch.setattr(bt.DAELBuiltin, "forward_backward", spy)
    code, out, err = cli(args_for(tiny_root, tmp_path / "o", extra=["TRAINER.DAEL.AUG_ON_DEVICE", "True"]), capsys)
    assert code == 0, err
    assert seen and all(s == (torch.uint8, False) for s in seen)  # the loader sends one uint8 image
    code, _, err = cli(
        args_for(
            tiny_root,
            tmp_path / "p",
            extra=[
                "TRAINER.DAEL.AUG_ON_DEVICE",
                "True",
                "TRAINER.DAEL.STRONG_TRANSFORMS",
                "['gaussian_blur', 'normalize']",
            ],
        ),
        capsys,
    )
    assert code == 2 and "AUG_ON_DEVICE cannot make" in err
