"""Dassl's Dynamic ResNets and EfficientNets rebuilt without Dassl (dael_plugin/backbones/
dynamic_resnet.py, efficientnet.py): Dassl's state dict and initial weights from a seed, its outputs,
gradients and draws, its pretrained file."""

from __future__ import annotations

import random
import re

import pytest
import torch

from dael_plugin.backbones import build_backbone
from dael_plugin.errors import DAELConfigError

NAMES = ["resnet18_dynamic", "resnet18_dynamic_ms_l12", "resnet50_dynamic_ms_l1", "resnet101_dynamic_ms_l123"]


@pytest.mark.dassl
@pytest.mark.parametrize("name", NAMES)
def test_each_dynamic_resnet_equals_dassls(name):
    """From one seed: the same keys in the same order and the same initial values; then the same
    output in evaluation and, from the same random states, in training (MixStyle's draws), bit for bit."""
    from dassl.modeling.backbone import build_backbone as dassl_build

    torch.manual_seed(3)
    ref = dassl_build(name, pretrained=False)
    torch.manual_seed(3)
    ours = build_backbone(name)
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.out_features == ref.out_features
    x = torch.randn(4, 3, 48, 48)
    for seed in range(3):  # MixStyle mixes on some draws and not on others
        random.seed(seed), torch.manual_seed(seed)
        want = ref.train()(x)
        random.seed(seed), torch.manual_seed(seed)
        assert torch.equal(ours.train()(x), want), (name, seed)
    assert torch.equal(ours.eval()(x), ref.eval()(x))


def test_dynamic_resnets_without_dassl(tmp_path, monkeypatch):
    """Every name builds; a 3x3 convolution is a static kernel and four templates weighted per sample
    (the attention's softmax sums to 1); features 512 or 2048. PRETRAINED reads the DDG authors' file
    Dassl reads from the torch hub cache (its fc left out), and the record names it; offline without
    it, one line."""
    from dael_plugin.backbones import DASSL_IMAGENET

    assert sorted(n for n in DASSL_IMAGENET if "dynamic" in n) == sorted(
        f"resnet{d}_dynamic{m}" for d in (18, 50, 101) for m in ("", "_ms_l1", "_ms_l12", "_ms_l123")
    )
    net = build_backbone("resnet18_dynamic").eval()
    conv = net.layer2[0].conv1
    assert list(conv.kernel_templates) == ["conv_nn", "conv_11", "conv_n1", "conv_1n"]
    x = torch.randn(3, 64, 16, 16)
    weights = conv.attention(x)
    assert weights.shape == (3, 4) and torch.allclose(weights.sum(1), torch.ones(3))
    static = conv.conv(x) + sum(
        t(x) * weights[:, i].view(-1, 1, 1, 1) for i, t in enumerate(conv.kernel_templates.values())
    )
    assert torch.allclose(conv(x, x), static, atol=1e-6)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 512) and build_backbone("resnet50_dynamic").out_features == 2048
    _reads_dassls_file_from_the_cache(
        "resnet18_dynamic_ms_l1", "resnet18_dynamic-074db766.pth", "fc.", tmp_path, monkeypatch
    )


def _reads_dassls_file_from_the_cache(name, file_name, classifier, tmp_path, monkeypatch):
    """Pretrained ``name``: offline without ``file_name`` in the torch hub cache, one line; with it there
    (a classifier under ``classifier`` beside the backbone's keys), every key read from it, and recorded."""
    from dael_plugin.backbones.record import weights_record

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr("dael_plugin.backbones.timm_backbone.host_resolves", lambda url: False)
    with pytest.raises(DAELConfigError, match=re.escape(file_name) + r"\) are not in the torch hub cache"):
        build_backbone(name, pretrained=True)
    torch.manual_seed(5)
    net = build_backbone(name)
    file = {**net.state_dict(), f"{classifier}weight": torch.zeros(1000, net.out_features)}
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(file, cache / file_name)
    torch.manual_seed(6)
    net = build_backbone(name, pretrained=True)
    assert all(torch.equal(v, file[k]) for k, v in net.state_dict().items())
    record = weights_record(name, True, "", "builtin")
    assert record["source"] == "cache" and record["file"].endswith(file_name)


EFFICIENTNET_FEATURES = {0: 1280, 1: 1280, 2: 1408, 3: 1536, 4: 1792, 5: 2048, 6: 2304, 7: 2560}


@pytest.mark.dassl
@pytest.mark.parametrize("name", ["efficientnet_b0", "efficientnet_b3"])
def test_each_efficientnet_equals_dassls(name):
    """From one seed: Dassl's keys, order and initial values; from the same random states (drop
    connect, dropout), its features and gradients in training, then its batch-norm running
    statistics and evaluation output, bit for bit, at an input size other than
    the one its padding was computed for."""
    from dassl.modeling.backbone import build_backbone as dassl_build

    torch.manual_seed(3)
    ref = dassl_build(name, pretrained=False)
    torch.manual_seed(3)
    ours = build_backbone(name)
    assert list(ref.state_dict()) == list(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), ours.state_dict().values()))
    x = torch.randn(4, 3, 40, 40)
    for net in (ref, ours):
        torch.manual_seed(1)
        net.train()(x).square().sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), ours.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), ours.state_dict().values()))
    assert torch.equal(ours.eval()(x), ref.eval()(x)) and ours.out_features == ref.out_features


def test_efficientnets_without_dassl(tmp_path, monkeypatch):
    """b0 to b7 build with Dassl's feature sizes; b0 has EfficientNet-B0's 4,007,548 parameters; its
    padding is computed for 224 (the stem pads 0 left, 1 right). PRETRAINED reads the release file
    Dassl reads from the torch hub cache, its classifier _fc left out."""

    for k, features in EFFICIENTNET_FEATURES.items():
        assert build_backbone(f"efficientnet_b{k}").out_features == features
    net = build_backbone("efficientnet_b0").eval()
    assert sum(p.numel() for p in net.parameters()) == 4_007_548
    assert net._conv_stem.static_padding.padding == (0, 1, 0, 1)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 1280)
    _reads_dassls_file_from_the_cache("efficientnet_b0", "efficientnet-b0-355c32eb.pth", "_fc.", tmp_path, monkeypatch)


@pytest.mark.parametrize("name", ["resnet18_dynamic", "efficientnet_b0"])
def test_rebuilt_backbones_train_on_fake_cuda_tensors_mixing_no_cpu_tensor(name):
    """Built and run in training on fake CUDA tensors (FakeTensorMode raises on a CPU/CUDA mix): the
    templates' attention and EfficientNet's drop connect draw on the input's device. Not seen: the
    backward (it needs a CUDA context) and MixStyle's Beta draws (made on the host, then moved)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cuda"):
        net = build_backbone(name).train()
        out = net(torch.randn(4, 3, 32, 32))
        assert out.is_cuda and out.shape == (4, net.out_features)
