"""Dassl's transform names build Dassl's own operations on every path (dael_plugin.transforms.dassl_pil).

Against Dassl: every name of Dassl's ``AVAI_CHOICES``, seeded as Dassl's loader is seeded, gives the
same image bit for bit on a few hundred real photographs (crops of scikit-learn's two sample
photos), and leaves Python's, NumPy's and torch's random streams where Dassl's leaves them.
Without Dassl: hand-worked cases per operation, each one a plausible wrong definition (bilinear
resampling, torchvision's RandomErasing, a fixed magnitude, every drawn operation applied) fails.
"""

import random
import re

import numpy as np
import pytest
import torch
from PIL import Image

from dael_plugin.config.defaults import get_builtin_cfg
from dael_plugin.transforms import dassl_pil as D
from dael_plugin.transforms.host import DASSL_NAMES, build_train_transform


def real_crops(count: int, seed: int = 0):
    """``count`` crops of scikit-learn's two sample photographs, of random sizes and shapes."""
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(p) for p in load_sample_images().images]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        photo = photos[int(rng.integers(len(photos)))]
        w, h = int(rng.integers(20, 90)), int(rng.integers(20, 90))
        x, y = int(rng.integers(photo.width - w)), int(rng.integers(photo.height - h))
        out.append(photo.crop((x, y, x + w, y + h)))
    return out


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    # The CPU generator alone, which every transform draws from: torch.manual_seed also queues a
    # seed for CUDA, XPU and MTIA, formatting the caller's stack each time (a millisecond a call under
    # pytest, most of this file's time).
    torch.default_generator.manual_seed(seed)


def streams():
    """Where the three streams stand (one draw of each, then put back)."""
    r, n, t = random.getstate(), np.random.get_state(), torch.get_rng_state()
    out = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.setstate(r), np.random.set_state(n), torch.set_rng_state(t)
    return out


# ------------------------------------------------------------------ against Dassl's own code
def dassl_cfg(size):
    from dassl.config import get_cfg_default

    cfg = get_cfg_default()
    cfg.INPUT.SIZE = size
    return cfg


COMBOS = [
    ["randaugment2", "normalize"],  # DAEL's Digit-5 strong view
    ["random_flip", "cutout", "randaugment2", "normalize"],  # DAEL's miniDomainNet / PACS strong view
    ["random_flip", "random_translation", "normalize"],  # the weak view there
    ["random_crop", "gaussian_noise", "instance_norm", "colorjitter"],
    ["random_resized_crop", "randomgrayscale", "gaussian_blur", "svhn_policy", "cutout"],
]


@pytest.fixture(scope="module")
def photos():
    return real_crops(300)


@pytest.fixture
def dassl_numpy_alias(monkeypatch):
    # Dassl 0.6.3 calls np.int (gone since NumPy 1.24) in SolarizeAdd and the AutoAugment policies:
    # its code is run here with the alias it was written for.
    monkeypatch.setattr(np, "int", int, raising=False)


@pytest.mark.dassl
@pytest.mark.parametrize(
    "choices,size",
    [([name], (32, 32)) for name in DASSL_NAMES] + [(c, (40, 56)) for c in COMBOS],
    ids=lambda v: "+".join(v) if isinstance(v, list) else "x".join(map(str, v)),
)
def test_every_dassl_name_gives_dassls_image_bit_for_bit(choices, size, photos, dassl_numpy_alias):
    from dassl.data.transforms.transforms import AVAI_CHOICES, build_transform

    assert set(DASSL_NAMES) == set(AVAI_CHOICES)
    cfg = dassl_cfg(size)
    theirs = build_transform(cfg, is_train=True, choices=choices)
    ours = build_train_transform(cfg, choices)
    # The same operations with the same arguments, in the same order (the classes are ours).
    assert [type(t).__name__ for t in ours.transforms] == [type(t).__name__ for t in theirs.transforms]
    changed = 0
    for i, img in enumerate(photos):
        seed_all(i)
        try:
            want = theirs(img)
        except ValueError as e:  # random_crop of an image smaller than the crop: Dassl refuses it, as do we
            seed_all(i)
            with pytest.raises(ValueError, match=re.escape(str(e))):
                ours(img)
            continue
        after = streams()
        seed_all(i)
        got = ours(img)
        assert torch.equal(got, want), f"{choices} differs from Dassl's on photo crop {i}"
        assert streams() == after, f"{choices} leaves the random streams elsewhere than Dassl's (crop {i})"
        seed_all(i + 10_000)
        changed += not torch.equal(ours(img), got)
    if not set(choices) <= {"normalize", "instance_norm", "center_crop"}:
        assert changed > 0  # the name draws: another seed gives another view


@pytest.mark.dassl
def test_the_policies_tables_are_dassls(dassl_numpy_alias):
    """Every sub-policy of the three AutoAugment policies: the same operations, probabilities and
    magnitudes as Dassl's (an entry copied wrong fails here even where no seed draws it)."""
    from dassl.data.transforms import autoaugment as aa

    for name in ("ImageNetPolicy", "CIFAR10Policy", "SVHNPolicy"):
        theirs, ours = getattr(aa, name)(), getattr(D, name)()
        assert len(theirs.policies) == len(ours.policies) == 25
        for t, o in zip(theirs.policies, ours.policies):
            (p1, _, m1), (p2, _, m2) = o.halves
            assert (t.p1, t.p2, t.magnitude1, t.magnitude2) == (p1, p2, m1, m2)


@pytest.mark.dassl
def test_the_randaugment_lists_are_dassls():
    from dassl.data.transforms import randaugment as ra

    for theirs, ours in (
        (ra.randaugment_list(), D.RANDAUGMENT_LIST),
        (ra.randaugment_list2(), D.RANDAUGMENT2_LIST),
        (ra.fixmatch_list(), D.FIXMATCH_LIST),
    ):
        assert [(lo, hi) for _, lo, hi in theirs] == [(lo, hi) for _, lo, hi in ours]
        assert [f.__name__.lower() for f, _, _ in theirs] == [f.__name__.replace("_", "") for f, _, _ in ours]


@pytest.mark.dassl
def test_the_interpolations_are_dassls():
    """INPUT.INTERPOLATION takes Dassl's names, each Dassl's mode (another name is refused in one
    line before the data: Dassl raises a KeyError for it as it builds the transforms)."""
    from dassl.data.transforms.transforms import INTERPOLATION_MODES

    from dael_plugin.transforms.registry import INTERPOLATION

    assert INTERPOLATION == INTERPOLATION_MODES


# ------------------------------------------------------------------ hand-worked, without Dassl
def dot(size=(9, 9), at=(6, 4), value=255):
    """A black RGB image with one pixel lit at ``at`` (x, y)."""
    a = np.zeros((size[1], size[0], 3), np.uint8)
    a[at[1], at[0]] = value
    return Image.fromarray(a)


def lit(img):
    return [(int(x), int(y)) for y, x in zip(*np.nonzero(np.asarray(img)[..., 0]))]


def force_sign(monkeypatch, keep: bool):
    """Dassl's geometric operations keep the sign when ``random.random() <= 0.5``."""
    monkeypatch.setattr(random, "random", lambda: 0.25 if keep else 0.75)


def test_rotate_resamples_nearest_and_flips_its_sign_inside(monkeypatch):
    # 90 degrees counter-clockwise about the centre (4.5, 4.5) of a 9x9 image: the pixel (6, 4)
    # goes to (4, 2), whole (nearest); bilinear resampling would spread it over its neighbours.
    force_sign(monkeypatch, keep=True)
    out = D.rotate(dot(), 90)
    assert lit(out) == [(4, 2)] and np.asarray(out).max() == 255
    force_sign(monkeypatch, keep=False)
    assert lit(D.rotate(dot(), 90)) == [(4, 6)]  # -90: clockwise


def test_translate_and_shear_are_pil_affine_maps_of_the_fraction_or_pixels(monkeypatch):
    force_sign(monkeypatch, keep=True)
    img = dot(size=(10, 10), at=(6, 4))
    assert lit(D.translate_x(img, 0.2)) == [(4, 4)]  # output x reads input x + 0.2 * 10
    assert lit(D.translate_y(img, 0.3)) == [(6, 1)]
    assert lit(D.translate_x_abs(img, 3)) == [(3, 4)]
    assert lit(D.translate_y_abs(img, 4)) == [(6, 0)]
    # shear x: output (x, y) reads input (x + v y, y): the pixel (6, 4) at v 0.25 lands at x 5
    assert lit(D.shear_x(img, 0.25)) == [(5, 4)]
    force_sign(monkeypatch, keep=False)
    assert lit(D.translate_x(img, 0.2)) == [(8, 4)]


def test_solarize_add_truncates_after_adding_and_solarizes_at_128():
    img = Image.fromarray(np.array([[[100, 20, 250]]], np.uint8))
    # 100 + 37.9 = 137.9 -> 137 -> at or over 128: 255 - 137 = 118; 20 -> 57.9 -> 57; 250 -> 255 -> 0
    assert np.asarray(D.solarize_add(img, 37.9)).tolist() == [[[118, 57, 0]]]


def test_posterize_keeps_the_integer_part_of_its_bits():
    img = Image.fromarray(np.array([[[255, 17, 100]]], np.uint8))
    assert np.asarray(D.posterize(img, 4.9)).tolist() == [[[240, 16, 96]]]  # 4 bits, not 5


def test_cutout_squares_are_clipped_at_the_border_not_moved_inside(monkeypatch):
    """Dassl's Cutout: rows [cy - L//2, cy + L//2) clipped; a centre at the corner cuts a quarter
    (torchvision's RandomErasing would cut a whole square inside the image)."""
    draws = iter([0, 0, 7, 3])
    monkeypatch.setattr(np.random, "randint", lambda n: next(draws))
    out = D.Cutout(n_holes=2, length=4)(torch.ones(1, 8, 8))
    zero = (out[0] == 0).nonzero().tolist()
    assert sorted(zero) == sorted(
        [[r, c] for r in (0, 1) for c in (0, 1)] + [[r, c] for r in (5, 6, 7) for c in (1, 2, 3, 4)]
    )


def test_cutout_abs_draws_its_corner_as_dassls_uniform_w(monkeypatch):
    """``np.random.uniform(w)`` is uniform(low=w, high=1): drawn here at its low end, the grey
    square sits at the bottom right, from int(w - v/2)."""
    monkeypatch.setattr(np.random, "uniform", lambda low, high=1.0: low)
    out = np.asarray(D.cutout_abs(Image.new("RGB", (10, 10)), 4))
    grey = np.argwhere((out == (125, 123, 114)).all(-1))
    assert grey.min(0).tolist() == [8, 8] and grey.max(0).tolist() == [9, 9]


def test_randaugment2_applies_each_draw_with_p_and_a_uniform_magnitude(monkeypatch):
    """Over many draws: 60% of the drawn operations apply, each operation equally often, at
    magnitudes uniform in its range (a fixed magnitude, or applying every draw, fails)."""
    seen = []

    def recorder(i):
        return lambda img, v: seen.append((i, v)) or img

    ops = [(recorder(i), lo, hi) for i, (_, lo, hi) in enumerate(D.RANDAUGMENT2_LIST)]
    monkeypatch.setattr(D, "RANDAUGMENT2_LIST", ops)
    random.seed(0)
    img = Image.new("RGB", (4, 4))
    for _ in range(6000):
        D.RandAugment2(n=2)(img)
    assert abs(len(seen) / 12_000 - 0.6) < 0.015
    counts = np.bincount([i for i, _ in seen], minlength=len(ops))
    assert counts.min() > 0.8 * len(seen) / len(ops)
    rot = np.array([v for i, v in seen if i == 8])  # Rotate, uniform in [-30, 30]
    assert rot.min() > -30 and rot.max() < 30 and abs(rot.mean()) < 2 and abs(rot.std() - 60 / 12**0.5) < 1.5


def test_random_2d_translation_enlarges_and_crops_with_p_half():
    img = Image.fromarray(np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3) % 251)
    t = D.Random2DTranslation(16, 16)
    sizes, same = set(), 0
    random.seed(1)
    plain = np.asarray(img.resize((16, 16), Image.BILINEAR))
    for _ in range(400):
        out = t(img)
        sizes.add(out.size)
        same += np.array_equal(np.asarray(out), plain)
    assert sizes == {(16, 16)} and 150 < same < 250  # about half untouched (resized to 16: the same image)


def test_gaussian_noise_adds_with_p_half_and_instance_norm_is_per_channel():
    x = torch.zeros(1, 4, 4)
    random.seed(0)
    noisy = sum(not torch.equal(D.GaussianNoise(0, 0.1)(x), x) for _ in range(400))
    assert 160 < noisy < 240
    img = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[2.0, 2.0], [2.0, 6.0]]])
    out = D.InstanceNormalization()(img)
    torch.testing.assert_close(out[0].flatten(), (torch.tensor([1.0, 2, 3, 4]) - 2.5) / 1.2909944)  # unbiased std
    torch.testing.assert_close(out[1].flatten(), torch.tensor([-0.5, -0.5, -0.5, 1.5]))


def test_autoaugment_magnitudes_and_sub_policy_draws():
    pol = D.ImageNetPolicy()
    assert len(pol.policies) == 25
    (p1, _, m1), (p2, _, m2) = pol.policies[0].halves
    assert (p1, m1, p2) == (0.4, 4, 0.6)  # posterize index 8: round(linspace(8, 4, 10))[8] = 4 bits
    assert m2 == pytest.approx(30.0)  # rotate index 9: 30 degrees


def test_every_dassl_name_builds_dassls_classes_without_dassl():
    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (32, 32)
    tfm = build_train_transform(cfg, ["normalize", "cutout", "randaugment2", "random_translation", "instance_norm"])
    kinds = [type(t).__name__ for t in tfm.transforms]
    assert kinds == ["Resize", "Random2DTranslation", "RandAugment2", "ToTensor", "Cutout", "Normalize",
                     "InstanceNormalization"]  # fmt: skip
    out = tfm(real_crops(1)[0])
    assert out.shape == (3, 32, 32)


# ------------------------------------------------------------------ the device kernels' draws
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXabs", "TranslateYabs"}


def dassl_draws(policy, slots: int):
    """Run Dassl's own policy object with each operation replaced by a recorder that reads the
    value the operation is given, and the sign Dassl's geometric operations then draw inside
    (peeked from Python's stream, which the real operation, still called, then consumes)."""
    seen = []
    probe = Image.new("RGB", (4, 4))

    def recorder(i, op):
        name = op.__name__

        def run(img, v):
            if name in GEOMETRIC:
                state = random.getstate()
                v = -v if random.random() > 0.5 else v
                random.setstate(state)
            seen.append((i, float(v) * (1 / 255 if name == "Solarize" else 1)))
            op(probe, abs(v) if name in GEOMETRIC else v)
            return img

        return run

    names = [op.__name__ for op, _, _ in policy.augment_list]
    policy.augment_list = [(recorder(i, op), lo, hi) for i, (op, lo, hi) in enumerate(policy.augment_list)]
    random.seed(0), np.random.seed(0)
    for _ in range(slots // policy.n):
        policy(probe)
    return names, seen


@pytest.mark.dassl
@pytest.mark.parametrize("name", ["randaugment2", "randaugment_fixmatch", "randaugment"])
def test_the_device_kernels_draw_dassls_distribution(name, dassl_numpy_alias):
    """Which operation, whether it applies, its magnitude and sign: the device kernel's draws
    (AUG_ON_DEVICE) against Dassl's own policy's, over 24,000 slots each."""
    from dassl.data.transforms import randaugment as ra

    from dael_plugin.transforms.registry import BY_NAME, Context

    cfg = get_builtin_cfg()
    theirs = {"randaugment2": ra.RandAugment2(2), "randaugment_fixmatch": ra.RandAugmentFixMatch(2),
              "randaugment": ra.RandAugment(2, 10)}[name]  # fmt: skip
    cfg.INPUT.RANDAUGMENT_N, cfg.INPUT.RANDAUGMENT_M = 2, 10
    ours = BY_NAME[name].device(Context(cfg.INPUT))
    slots = 24_000
    names, seen = dassl_draws(theirs, slots)
    assert names == ours.names  # the same list, in the same order (random.choices indexes it)
    torch.manual_seed(0)
    pick, v = ours.draws(slots)
    k = len(names)
    freq_theirs = np.bincount([i for i, _ in seen], minlength=k) / slots
    freq_ours = np.bincount(pick[pick >= 0].numpy(), minlength=k) / slots
    np.testing.assert_allclose(freq_ours, freq_theirs, atol=0.008)  # standard error about 0.0017
    assert abs((pick < 0).float().mean().item() - (1 - freq_theirs.sum())) < 0.012  # the skipped slots
    for i, op in enumerate(names):
        a = np.array([x for j, x in seen if j == i])
        b = v[pick == i].numpy()
        if op in GEOMETRIC:  # the sign apart (a two-valued magnitude has no stable median)
            assert abs((a < 0).mean() - (b < 0).mean()) < 0.06, op
            a, b = np.abs(a), np.abs(b)
        lo, hi = min(a.min(), b.min()), max(a.max(), b.max())
        span = max(hi - lo, 1e-6)
        for q in (0.05, 0.25, 0.5, 0.75, 0.95):
            want = np.quantile(a, q)
            assert abs(want - np.quantile(b, q)) < 0.05 * span + 1e-5 * max(1.0, abs(want)), (op, q)  # float32
