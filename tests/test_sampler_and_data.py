import os
import time

import numpy as np
import pytest

from dael_plugin.data import embedded
from dael_plugin.data.folders import load_splits
from dael_plugin.data.sampling import DomainBalancedBatchSampler
from dael_plugin.errors import DAELConfigError


def indices(sampler):
    """The image indices of each batch (a sampler yields (index, draw_seed) pairs)."""
    return [[i for i, _ in b] for b in sampler]


def test_epoch_length_is_stated_and_covers_largest_domain():
    domains = [0] * 100 + [1] * 30 + [2] * 55
    s = DomainBalancedBatchSampler(domains, batch_size=30)
    batches = indices(s)
    assert len(s) == len(batches) == 10  # ceil(100 / 10)
    seen = {i for b in batches for i in b}
    assert set(range(100)) <= seen  # every image of the largest domain, once
    assert set(range(100, 130)) <= seen  # the small domain is cycled, not dropped
    for b in batches:  # contiguous single-domain chunks, in domain order
        assert [domains[i] for i in b] == [0] * 10 + [1] * 10 + [2] * 10
    first_domain = [i for b in batches for i in b[:10]]
    assert len(first_domain) == len(set(first_domain)) == 100  # no repeats within a pass


def test_fewer_domains_per_batch_and_determinism():
    domains = np.repeat(np.arange(4), 50)
    s = DomainBalancedBatchSampler(domains, batch_size=20, n_domain=2, seed=3)
    a = indices(s)
    s.set_epoch(0)  # the epoch again: its batches again (a second pass of one epoch draws anew)
    assert a == indices(s)
    s.set_epoch(1)
    assert indices(s) != a
    for b in a:
        d = [domains[i] for i in b]
        assert len(set(d[:10])) == 1 and len(set(d[10:])) == 1 and d[0] != d[10]


def test_epoch_plan_scales_linearly_on_domainnet_sized_data():
    """Planning an epoch of 10x more images costs about 10x, not 100x (a
    ``list.remove`` sampler is quadratic). A ratio, so no machine speed is assumed.

    Other processes on the machine only ever slow one side of a measurement, so the
    lowest ratio of a few interleaved trials is kept (under a concurrent sweep on the
    2-core VM single trials read 12 to 46; alone, about 12; with four training runs beside the
    suite's two workers, the lowest of five was 30.6). A quadratic plan reads about 100."""
    small_s = DomainBalancedBatchSampler(np.repeat(np.arange(6), 10_000), batch_size=60)
    large_s = DomainBalancedBatchSampler(np.repeat(np.arange(6), 100_000), batch_size=60)

    def seconds(sampler):
        t = time.perf_counter()
        plan = sampler.plan()
        return time.perf_counter() - t, plan

    plan = large_s.plan()
    assert plan.shape == (10_000, 60)
    assert sorted(np.unique(plan[:, :10])) == list(range(100_000))  # domain 0, each image once
    ratios = []
    for _ in range(5):
        small = min(seconds(small_s)[0] for _ in range(3))
        large = min(seconds(large_s)[0] for _ in range(3))
        ratios.append(large / small)
        if ratios[-1] < 50:
            break
    assert min(ratios) < 50, ratios


def test_draw_seeds_depend_on_seed_epoch_and_position_only():
    from dael_plugin.data.sampling import SeededRandomBatchSampler

    domains = np.repeat(np.arange(3), 20)
    a = list(DomainBalancedBatchSampler(domains, batch_size=12, seed=5))
    b = list(DomainBalancedBatchSampler(domains, batch_size=12, seed=5))
    assert a == b
    seeds = [s for batch in a for _, s in batch]
    assert len(set(seeds)) == len(seeds)  # every draw its own seed, even of the same image
    c = DomainBalancedBatchSampler(domains, batch_size=12, seed=5)
    c.set_epoch(1)
    assert [s for batch in c for _, s in batch] != seeds
    u = SeededRandomBatchSampler(50, 8, seed=5)
    assert len(u) == 6 and list(u) == list(SeededRandomBatchSampler(50, 8, seed=5))
    assert sorted(i for batch in u for i, _ in batch) != list(range(48))  # shuffled


def test_indivisible_batch_is_a_clear_error():
    with pytest.raises(DAELConfigError, match="not divisible"):
        DomainBalancedBatchSampler([0, 1, 2] * 10, batch_size=10)


def test_embedded_set_is_deterministic_and_complete(tmp_path, data_root):
    a = embedded.generate(str(tmp_path / "a"))
    assert set(a) == set(embedded.DOMAINS)
    for d in embedded.DOMAINS:
        assert a[d]["train"] > 900 and a[d]["test"] >= 200
    import os

    for rel in ("street/test/3", "font/train/7", "blend/train/0"):
        first = sorted(os.listdir(tmp_path / "a" / rel))[0]
        ref = (tmp_path / "a" / rel / first).read_bytes()
        assert ref == open(f"{data_root}/embedded_digits/{rel}/{first}", "rb").read()


def test_embedded_domains_look_different(data_root):
    from PIL import Image

    stats = {}
    for d in embedded.DOMAINS:
        splits = load_splits(
            "EmbeddedDigitsDG",
            data_root,
            [d, "hand" if d != "hand" else "font"],
            ["blend" if d != "blend" else "street"],
        )
        imgs = [np.asarray(Image.open(i.impath), dtype=np.float32) for i in splits["train_x"][:200] if i.domain == 0]
        arr = np.stack(imgs)
        stats[d] = (arr.mean(), arr.std(axis=3).mean())  # brightness, colourfulness
    assert stats["hand"][1] == pytest.approx(0.0, abs=1e-6)  # grey
    assert stats["street"][1] > 10 and stats["font"][1] > 10  # coloured
    assert stats["hand"][0] < stats["blend"][0]  # dark background vs photos


def test_splits_da_vs_dg(data_root):
    da = load_splits("EmbeddedDigits", data_root, ["hand", "blend", "font"], ["street"])
    dg = load_splits("EmbeddedDigitsDG", data_root, ["hand", "blend", "font"], ["street"])
    assert da["train_u"] and dg["train_u"] is None
    assert dg["val"] and da["val"] is None
    assert {i.domain for i in da["train_x"]} == {0, 1, 2}
    train_u = {i.impath for i in da["train_u"]}
    assert not train_u & {i.impath for i in da["test"]}
    assert da["classnames"] == [str(i) for i in range(10)]


def test_unknown_domain_and_missing_folder(tmp_path, data_root):
    with pytest.raises(DAELConfigError, match="has no domain 'svhn'"):
        load_splits("EmbeddedDigits", data_root, ["hand", "blend"], ["svhn"])
    with pytest.raises(DAELConfigError, match="dataset folder .* not found"):
        load_splits("DigitsDG", str(tmp_path), ["mnist", "svhn"], ["syn"])


def test_user_folder_layout(tmp_path):
    from PIL import Image

    for dom in ("a", "b", "c"):
        for split in ("train", "test"):
            for cls in ("cat", "dog"):
                p = tmp_path / dom / split / cls
                p.mkdir(parents=True)
                Image.new("RGB", (8, 8)).save(p / "x.png")
    s = load_splits("DomainFolders", str(tmp_path), ["a", "b"], ["c"])
    assert len(s["train_x"]) == 4 and len(s["train_u"]) == 2 and len(s["test"]) == 2
    assert s["classnames"] == ["cat", "dog"]


def _fake_dassl_dg_layout(root, dataset_dir, domains, classes, per_split=2):
    """``<root>/<dataset_dir>/<domain>/{train,val}/<class>/*.jpg``, as Dassl expects."""
    from PIL import Image

    for dom in domains:
        for split in ("train", "val"):
            for cls in classes:
                p = os.path.join(root, dataset_dir, dom, split, cls)
                os.makedirs(p)
                for k in range(per_split):
                    Image.new("RGB", (8, 8)).save(os.path.join(p, f"{k}.jpg"))  # Dassl globs *.jpg


@pytest.mark.parametrize(
    "name,dataset_dir,domains,classes",
    [
        ("DigitsDG", "digits_dg", ("mnist", "mnist_m", "svhn", "syn"), [str(i) for i in range(10)]),
        (
            "OfficeHomeDG",
            "office_home_dg",
            ("art", "clipart", "product", "real_world"),
            ["Alarm_Clock", "Backpack", "Bike"],
        ),
    ],
)
def test_dassl_dg_folder_layouts(tmp_path, name, dataset_dir, domains, classes):
    _fake_dassl_dg_layout(str(tmp_path), dataset_dir, domains, classes)
    s = load_splits(name, str(tmp_path), list(domains[:3]), [domains[3]])
    n = len(classes) * 2
    assert len(s["train_x"]) == 3 * n and s["train_u"] is None  # DG: no target data in training
    assert len(s["val"]) == 3 * n and len(s["test"]) == 2 * n  # test = the target's train + val, as in Dassl
    assert {i.domain for i in s["train_x"]} == {0, 1, 2}
    assert s["classnames"] == sorted(classes)
    assert all(os.path.basename(os.path.dirname(i.impath)) == s["classnames"][i.label] for i in s["test"])


@pytest.mark.dassl
def test_dg_folder_layouts_read_as_dassl_reads_them(tmp_path):
    """The same (image, label) lists as Dassl's own DigitsDG and OfficeHomeDG readers."""
    from dassl.config import get_cfg_default
    from dassl.data.datasets import build_dataset

    for name, dataset_dir, domains, classes in [
        ("DigitsDG", "digits_dg", ("mnist", "mnist_m", "svhn", "syn"), [str(i) for i in range(10)]),
        ("OfficeHomeDG", "office_home_dg", ("art", "clipart", "product", "real_world"), ["Bike", "Alarm_Clock"]),
    ]:
        _fake_dassl_dg_layout(str(tmp_path), dataset_dir, domains, classes)
        cfg = get_cfg_default()
        cfg.DATASET.NAME, cfg.DATASET.ROOT = name, str(tmp_path)
        cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS = list(domains[:3]), [domains[3]]
        ref = build_dataset(cfg)
        ours = load_splits(name, str(tmp_path), list(domains[:3]), [domains[3]])
        for split in ("train_x", "val", "test"):
            want = sorted((os.path.abspath(d.impath), d.label, d.domain) for d in getattr(ref, split))
            got = sorted((os.path.abspath(i.impath), i.label, i.domain) for i in ours[split])
            assert got == want, (name, split)


def test_dassl_domain_sampler_has_dassls_epochs_drawn_per_position():
    """Dassl's RandomDomainSampler epochs: the epoch ends after the batch that leaves a chosen domain
    short; chunks are single-domain, domains distinct within a batch, no image twice in an epoch;
    the draws are a function of (seed, epoch, pass)."""
    from dael_plugin.data.sampling import DasslDomainBatchSampler

    domains = [0] * 100 + [1] * 31 + [2] * 55
    s = DasslDomainBatchSampler(domains, batch_size=30, seed=3)
    assert len(s) == min(100 // 10, 31 // 10, 55 // 10) == 3 == len(indices(s))
    s = DasslDomainBatchSampler(domains, batch_size=20, n_domain=2, seed=3)
    batches, per = indices(s), s.per_domain
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat))  # without replacement within the epoch
    left = {d: domains.count(d) for d in (0, 1, 2)}
    for n, b in enumerate(batches, 1):
        chunks = [b[j : j + per] for j in range(0, len(b), per)]
        assert all(len({domains[i] for i in c}) == 1 for c in chunks)
        chosen = [domains[c[0]] for c in chunks]
        assert len(set(chosen)) == 2
        for d in chosen:
            left[d] -= per
        short = any(left[d] < per for d in chosen)
        assert short == (n == len(batches))  # Dassl stops right after the batch that leaves one short
    s.set_epoch(0)
    first = indices(s)
    again = indices(s)  # a second pass in the same epoch (a target loader that restarts)
    s.set_epoch(0)
    assert indices(s) == first and again != first
    s.set_epoch(1)
    assert indices(s) != first
    seq = DasslDomainBatchSampler(domains, batch_size=30, seed=3, sequential=True)
    assert all([domains[b[j]] for j in (0, 10, 20)] == [0, 1, 2] for b in indices(seq))
    with pytest.raises(DAELConfigError, match="source domain 0 has 5 training images, fewer than its per-batch share"):
        DasslDomainBatchSampler([0] * 5 + [1] * 50, batch_size=20)
    with pytest.raises(DAELConfigError, match=r"source domain 'hospital_3' has 5 training images"):
        DasslDomainBatchSampler([0] * 50 + [1] * 5, batch_size=20, names=["hospital_0", "hospital_3"])


@pytest.mark.dassl
def test_dassl_domain_sampler_epochs_have_dassls_length():
    """Against Dassl's own RandomDomainSampler over many draws: the same epoch lengths."""
    import collections
    import random
    from types import SimpleNamespace

    from dassl.data.samplers import RandomDomainSampler

    from dael_plugin.data.sampling import DasslDomainBatchSampler

    domains = [0] * 70 + [1] * 31 + [2] * 55
    data = [SimpleNamespace(domain=d) for d in domains]  # all the sampler reads of a Datum
    for batch, n_domain in ((30, 3), (20, 2)):
        random.seed(0)
        theirs = collections.Counter(len(list(RandomDomainSampler(data, batch, n_domain))) // batch for _ in range(200))
        ours = collections.Counter(len(DasslDomainBatchSampler(domains, batch, n_domain, seed=e)) for e in range(200))
        assert set(ours) == set(theirs), (ours, theirs)
        if n_domain == 3:
            assert set(ours) == {3}


def test_a_batch_holds_the_random_states_once_and_draws_what_each_item_draws(tmp_path, monkeypatch):
    """The loader's batched fetch (``__getitems__``) saves and puts back torch's, NumPy's and
    Python's random states once a batch, not once a draw: the same views bit for bit, and the
    model's own streams (dropout) untouched."""
    import random

    import torch
    from PIL import Image
    from torchvision import transforms as T

    from dael_plugin.data.items import Item
    from dael_plugin.data.loaders import train_loader

    items = []
    for i in range(6):
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(path)
        items.append(Item(str(path), i % 2, i % 2, f"c{i % 2}"))

    def numpy_and_python(img):  # a transform that draws from NumPy's and Python's streams too
        return img.rotate(float(np.random.uniform(-30, 30)) + random.uniform(-5, 5))

    tfms = [T.Compose([T.RandAugment(), numpy_and_python, T.RandomHorizontalFlip(), T.PILToTensor()])] * 2
    loader = train_loader(items, tfms, 3, 0, False, seed=7, sampler="RandomSampler")
    torch.manual_seed(123), np.random.seed(5), random.seed(9)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())

    saves = []
    real = torch.get_rng_state
    monkeypatch.setattr(torch, "get_rng_state", lambda: saves.append(1) or real())
    batches = list(loader)
    assert len(batches) == 2 and len(saves) == 2  # one save a batch of three draws
    monkeypatch.setattr(torch, "get_rng_state", real)

    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1]) and random.getstate() == before[2]
    loader.batch_sampler.set_epoch(0)  # the same pass's draws again (a second pass draws afresh)
    keys = [k for batch in loader.batch_sampler for k in batch]
    one_by_one = [loader.dataset[k] for k in keys]  # each draw holds the states itself
    for name in ("img", "img2"):
        assert torch.equal(torch.cat([b[name] for b in batches]), torch.stack([o[name] for o in one_by_one]))
    assert not torch.equal(batches[0]["img"], batches[0]["img2"])  # the two views are drawn, not copied


def test_a_view_that_draws_nothing_is_made_once_per_image(tmp_path, monkeypatch):
    """Resize, centre crop, to-tensor and normalise give an image the same view every epoch: the
    built-in loader keeps it (small images, within VIEW_CACHE_BYTES) and makes it once; a view
    that draws, an unknown operation (Dassl's), a large image, an unreadable one and anything past
    the byte budget are made each time."""
    import torch
    from PIL import Image
    from torchvision import transforms as T

    from dael_plugin.data import loaders
    from dael_plugin.data.items import Item

    items = []
    for i, side in enumerate((12, 12, 12, 70)):  # the last is over the reader's 64x64 cache rule
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(path)
        items.append(Item(str(path), 0, 0, "c0"))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    items.append(Item(str(tmp_path / "bad.png"), 0, 0, "c0"))
    made = {"fixed": 0, "drawn": 0, "unknown": 0}

    def counted(name):
        def step(x):
            made[name] += 1
            return x

        return step

    class Counted(T.ToTensor):  # an operation the loader does not know: treated as drawing
        def __call__(self, pic):
            made["unknown"] += 1
            return super().__call__(pic)

    fixed = T.Compose([T.Resize((8, 8)), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    real_fixed = fixed.transforms[1]
    fixed.transforms[1] = type("Known", (T.ToTensor,), {})()  # a subclass is not a known step either
    assert not loaders.draws_nothing(fixed)
    fixed.transforms[1] = real_fixed
    assert loaders.draws_nothing(fixed)
    drawn = T.Compose([T.Resize((8, 8)), T.RandomHorizontalFlip(), T.ToTensor()])
    unknown = T.Compose([T.Resize((8, 8)), Counted()])
    calls = []
    real_call = T.Normalize.forward
    monkeypatch.setattr(T.Normalize, "forward", lambda self, x: calls.append(1) or real_call(self, x))
    monkeypatch.setattr(T.RandomHorizontalFlip, "forward", lambda self, x: counted("drawn")(x))
    ds = loaders.ImageList(items, [fixed, drawn, unknown], replace_bad=False)
    first = [ds[i] for i in range(5)]
    again = [ds[i] for i in range(5)]
    assert len(calls) == 5 + 2  # four readable images and the placeholder; then the large one and the placeholder
    assert made["drawn"] == made["unknown"] == 10
    for a, b in zip(first, again):
        assert torch.equal(a["img"], b["img"])
    assert [k for k, _ in ds._views] == [0, 0, 0] and ds._view_bytes == 3 * 3 * 8 * 8 * 4
    assert not first[4]["valid"]  # the unreadable image: its placeholder view is never kept

    monkeypatch.setattr(loaders, "VIEW_CACHE_BYTES", 3 * 8 * 8 * 4)  # room for one view
    calls.clear()
    ds = loaders.ImageList(items[:3], fixed, replace_bad=False)
    for _ in range(2):
        [ds[i] for i in range(3)]
    assert len(calls) == 3 + 2 and len(ds._views) == 1


def test_kept_views_leave_a_run_unchanged_bit_for_bit(tmp_path, tiny_root, monkeypatch):
    """SourceOnly (its weak view and the test view draw nothing) for two epochs with per-epoch
    records: the same weights, records and accuracy with the views kept and with none kept."""
    import json

    import torch

    from conftest import run_here
    from dael_plugin.data import loaders
    from test_hardening import args_for

    so_cfg = os.path.join(os.path.dirname(__file__), "..", "configs/trainers/da/source_only/embedded_digits.yaml")
    made = {}
    for name, budget in (("kept", loaders.VIEW_CACHE_BYTES), ("none", 0)):
        monkeypatch.setattr(loaders, "VIEW_CACHE_BYTES", budget)
        out = tmp_path / name
        args = args_for(tiny_root, out, epochs=2, trainer="SourceOnly", cfg=so_cfg, extra=["SELECTION.EVAL_FREQ", "1"])
        proc = run_here(args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        state = torch.load(out / "checkpoint.pth.tar", weights_only=True, map_location="cpu")
        records = [json.loads(line) for line in open(out / "epochs.jsonl")]
        made[name] = (state, records, json.loads((out / "results.json").read_text())["accuracy"])
    (a, ra, acc_a), (b, rb, acc_b) = made["kept"], made["none"]
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])  # the model's stream: no view drew from it
    assert len(ra) == 2 and ra == rb  # every accuracy and validator of both epochs
    assert acc_a == acc_b


def test_each_sampler_name_means_one_epoch_on_both_engines():
    """DATALOADER.TRAIN_X.SAMPLER: Dassl's names give Dassl's epoch (until the smallest domain runs
    short), the plugin's CyclingDomainSampler the largest domain's; both engines build their source
    loader's sampler through data/loaders.train_batches, which calls source_batch_sampler."""
    import dael_plugin
    from dael_plugin.data.sampling import source_batch_sampler

    domains = [0] * 100 + [1] * 30 + [2] * 55
    lengths = {name: len(source_batch_sampler(name, domains, 30, 0, seed=1)) for name in ("RandomDomainSampler",
               "SeqDomainSampler", "CyclingDomainSampler", "RandomSampler")}  # fmt: skip
    assert lengths == {"RandomDomainSampler": 3, "SeqDomainSampler": 3, "CyclingDomainSampler": 10, "RandomSampler": 6}
    a, b = (indices(source_batch_sampler("RandomDomainSampler", domains, 30, 0, seed=1)) for _ in range(2))
    assert a == b  # a function of (seed, epoch): the same plan in every process and engine
    pkg = os.path.dirname(dael_plugin.__file__)
    assert "source_batch_sampler(" in open(os.path.join(pkg, "data/loaders.py")).read()
    assert "train_batches(" in open(os.path.join(pkg, "data/loaders.py")).read()
    # the Dassl engine trains on the method's own loaders, in the method's epoch (the adapter's
    # source: it imports Dassl)
    adapter = open(os.path.join(pkg, "dassl_adapter/method_trainer.py")).read()
    assert "train_loader_x = property(lambda self: self.method.train_loader_x" in adapter
    assert "m.run_epoch(DasslsLog(self))" in adapter
    with pytest.raises(DAELConfigError, match="is not one of"):
        source_batch_sampler("RandomClassSampler", domains, 30, 0, seed=1)


@pytest.mark.dassl
def test_dassls_own_trainers_refuse_the_plugins_sampler_in_one_line():
    from dassl.config import get_cfg_default

    import dael_plugin  # noqa: F401 (registers DAEL)
    from dael_plugin.dassl_adapter.checks import check_trainer_cfg

    cfg = get_cfg_default()
    cfg.DATALOADER.TRAIN_X.SAMPLER = "CyclingDomainSampler"
    cfg.TRAINER.NAME = "M3SDA"
    with pytest.raises(DAELConfigError, match="the plugin's own; Dassl's M3SDA builds Dassl's samplers only"):
        check_trainer_cfg(cfg)
    cfg.TRAINER.NAME = "DAEL"
    check_trainer_cfg(cfg)


def test_a_batch_that_does_not_split_over_the_processes_is_one_line():
    """Under torchrun each process keeps its 1/N of every chunk (each domain's share, or the whole
    target batch): a chunk that N does not divide is refused in one line naming its key, and so is
    a short last batch that N does not divide. (How a line raised after the processes joined their
    group reaches the user once, from rank 0: test_distributed.py's tests of ranks that differ.)"""
    from dael_plugin.data.sampling import SeededRandomBatchSampler

    target = SeededRandomBatchSampler(20, 7, seed=1)
    with pytest.raises(DAELConfigError, match=r"TRAIN_U\.BATCH_SIZE.* is 7, which does not split over 2 processes"):
        target.set_shard(0, 2)
    source = DomainBalancedBatchSampler([0] * 9 + [1] * 9 + [2] * 9, 9, seed=1)  # 3 per domain
    with pytest.raises(DAELConfigError, match=r"per domain in a batch .* is 3, which does not split over 2 processes"):
        source.set_shard(1, 2)
    source.set_shard(1, 3)  # 3 divides it
    short = SeededRandomBatchSampler(9, 4, seed=1, drop_last=False)  # batches of 4, 4 and 1
    short.set_shard(0, 2)
    with pytest.raises(DAELConfigError, match=r"a last batch of 1 does not split over 2 processes"):
        list(short)


def test_a_cycled_pass_of_the_cycling_domain_sampler_draws_afresh():
    """A source loader cycled within an epoch (``TRAIN.COUNT_ITER train_u``) draws new batches on
    its second pass; its first pass is the epoch's plan, as before passes were counted."""
    from dael_plugin.data.sampling import DomainBalancedBatchSampler

    s = DomainBalancedBatchSampler([0] * 20 + [1] * 30, batch_size=4, seed=3)
    s.set_epoch(2)
    first, second = list(s), list(s)
    assert [[i for i, _ in b] for b in first] == s.plan(2).tolist()
    assert first != second and len(first) == len(second) == len(s)
    s.set_epoch(2)
    assert list(s) == first
