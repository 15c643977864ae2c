import numpy as np
import pytest
import torch
from PIL import Image

from dael_plugin import add_dael_config
from dael_plugin.backbones import TimmBackbone, build_backbone
from dael_plugin.config.defaults import get_builtin_cfg
from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.host import (
    DASSL_NAMES,
    EXTRA_NAMES,
    build_test_transform,
    build_train_transform,
    build_views,
)


def small_cfg():
    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (32, 32)
    cfg.INPUT.TRANSFORMS = ["random_crop", "normalize"]
    return cfg


@pytest.mark.parametrize("name", DASSL_NAMES + EXTRA_NAMES)
def test_every_transform_name_builds_without_dassl(name):
    cfg = small_cfg()
    tfm = build_train_transform(cfg, [name, "normalize"], cfg.TRAINER.DAEL)
    out = tfm(Image.new("RGB", (40, 36), (120, 30, 200)))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32


def test_views_weak_is_input_transforms_and_strong_differs():
    """The weak view is INPUT.TRANSFORMS (here deterministic: resize and normalise,
    so it equals the test transform); the strong views add TrivialAugment, are
    drawn independently, and differ from the weak view."""
    cfg = small_cfg()
    cfg.defrost()
    cfg.INPUT.TRANSFORMS = ("normalize",)
    views = build_views(cfg, ["tv_trivialaugment", "normalize"], 3, cfg.TRAINER.DAEL)
    assert len(views) == 3
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    weak = views[0](img)
    torch.testing.assert_close(weak, views[0](img))  # deterministic
    torch.testing.assert_close(weak, build_test_transform(cfg)(img))
    torch.manual_seed(0)
    strong = [views[1](img) for _ in range(8)]
    assert sum(not torch.equal(s_, weak) for s_ in strong) >= 6
    assert len({s_.sum().item() for s_ in strong}) >= 4  # independent draws, not one fixed view


def test_add_dael_config_is_idempotent_and_keeps_dassl_keys():
    cfg = get_builtin_cfg()
    cfg.TRAINER.DAEL.WEIGHT_U = 0.7
    add_dael_config(cfg)
    assert cfg.TRAINER.DAEL.WEIGHT_U == 0.7
    for node in ("DAEL", "DAELDG"):
        n = cfg.TRAINER[node]
        assert (n.CR_TARGET, n.CR_MODE, n.CLASSIFIER, n.PSEUDO_LABEL, n.CR_LOSS, n.VIEWS, n.LOSSES) == (
            "expert",
            "collaborative",
            "experts",
            "expert",
            "mse",
            "weak_strong",
            "ce_cr_u",
        )
        assert n.CONF_THRE == 0.95


@pytest.mark.parametrize(
    "name,size",
    [
        ("timm_resnet18", 32),
        ("timm_convnext_atto", 32),
        ("timm_efficientnet_b0", 32),
        ("timm_vit_tiny_patch16_224", 224),
        ("dael_small_cnn", 32),
        ("resnet18", 32),
        ("timm_mobilenetv3_small_050", 32),  # a head conv: its features are head_hidden_size, not num_features
    ],
)
def test_backbones_report_out_features(name, size):
    torch.manual_seed(0)
    b = build_backbone(name, pretrained=False).eval()
    with torch.no_grad():
        y = b(torch.randn(2, 3, size, size))
    assert y.shape == (2, b.out_features)
    assert not torch.allclose(y[0], y[1])  # the features depend on the image
    if isinstance(b, TimmBackbone):
        assert b.out_features == (getattr(b.model, "head_hidden_size", None) or b.model.num_features)
        # The features are timm's own model's (its pooled pre-logits), with the same weights.
        import timm

        ref = timm.create_model(name.removeprefix("timm_"), pretrained=False, num_classes=0).eval()
        ref.load_state_dict(b.model.state_dict())
        with torch.no_grad():
            torch.manual_seed(0)
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(b(x), ref(x), atol=1e-5, rtol=1e-4)


def test_a_weights_file_is_read_whenever_given_and_strictly(tmp_path, capsys):
    """MODEL.BACKBONE.WEIGHTS is read with PRETRAINED False too (most shipped configs: the file was
    ignored and the record named it), for timm's backbones and the plugin's own; a file with a
    known prefix (a DAEL checkpoint's ``F.``, ``backbone.``) loads with the prefix named; another
    model's weights (resnet34's into resnet18, where timm loaded the keys that fit) and a file that
    fills part of the backbone are one line each."""
    import timm

    from dael_plugin.backbones.record import weights_record

    torch.manual_seed(1)
    src = timm.create_model("resnet18", pretrained=False, num_classes=10)
    plain = tmp_path / "r18.pth"
    torch.save(src.state_dict(), plain)
    for pretrained in (True, False):
        b = build_backbone("timm_resnet18", pretrained=pretrained, weights_file=str(plain))
        torch.testing.assert_close(b.model.conv1.weight, src.conv1.weight)
    assert "left out (its classifier" in capsys.readouterr().out  # fc.* of the file, num_classes=0
    assert not torch.equal(build_backbone("timm_resnet18").model.conv1.weight, src.conv1.weight)
    prefixed = tmp_path / "prefixed.pth"
    torch.save({"model": {"F.model." + k: v for k, v in src.state_dict().items()} | {"E.weight": torch.zeros(3)}},
               prefixed)  # fmt: skip
    b = build_backbone("timm_resnet18", pretrained=False, weights_file=str(prefixed))
    torch.testing.assert_close(b.model.layer4[1].bn2.running_var, src.layer4[1].bn2.running_var)
    assert "prefix 'F.model.' stripped" in capsys.readouterr().out
    small = build_backbone("dael_small_cnn")
    own = tmp_path / "own.pth"
    torch.save({"backbone." + k: v for k, v in small.state_dict().items()}, own)
    loaded = build_backbone("dael_small_cnn", weights_file=str(own))
    assert all(torch.equal(v, small.state_dict()[k]) for k, v in loaded.state_dict().items())
    r34 = tmp_path / "r34.pth"
    torch.save(timm.create_model("resnet34", pretrained=False).state_dict(), r34)
    with pytest.raises(DAELConfigError, match="keys this backbone lacks .*another model's weights") as err:
        build_backbone("timm_resnet18", weights_file=str(r34))
    assert "\n" not in str(err.value)
    part = tmp_path / "part.pth"
    torch.save({k: v for k, v in src.state_dict().items() if not k.startswith("layer4")}, part)
    with pytest.raises(DAELConfigError, match=r"fills \d+ of the backbone's \d+ keys: layer4"):
        build_backbone("timm_resnet18", weights_file=str(part))
    rec = weights_record("timm_resnet18", False, str(plain))
    assert rec["file"] == str(plain) and len(rec["sha256"]) == 64
    assert weights_record("timm_resnet18", False, "")["read"] is None
    # Dassl's ResNets are torchvision's V1 weights, named so; with no file in timm's cache, none named
    assert weights_record("resnet18", True, "") == {"timm": "resnet18.tv_in1k", "tag": "tv_in1k"}


def test_timms_weights_in_its_cache_are_recorded_with_their_sha256(tmp_path, monkeypatch):
    """The file timm reads from the Hugging Face cache (a stand-in file here), and its sha256."""
    import hashlib

    from huggingface_hub import constants

    from dael_plugin.backbones.record import weights_record

    snap = tmp_path / "models--timm--resnet18.tv_in1k" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (tmp_path / "models--timm--resnet18.tv_in1k" / "refs").mkdir()
    (tmp_path / "models--timm--resnet18.tv_in1k" / "refs" / "main").write_text("abc")
    (snap / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    rec = weights_record("resnet18", True, "")
    assert rec["timm"] == "resnet18.tv_in1k" and rec["tag"] == "tv_in1k"
    assert rec["file"] == str(snap / "model.safetensors")
    assert rec["sha256"] == hashlib.sha256(b"weights").hexdigest()


def test_unknown_backbones_are_one_line_errors():
    with pytest.raises(DAELConfigError, match="timm has no model 'resnet181'.*did you mean timm_resnet18"):
        build_backbone("timm_resnet181")
    with pytest.raises(DAELConfigError, match=r"no weights tag 'foo' for resnet18 \(its tags: a1_in1k, .*tv_in1k\)"):
        build_backbone("timm_resnet18.foo")
    with pytest.raises(
        DAELConfigError, match=r"no weights tag 'x' for botnet50ts_256 \(it has none; use timm_botnet50ts_256\)"
    ):
        build_backbone("timm_botnet50ts_256.x")
    with pytest.raises(
        DAELConfigError, match="'efficientnet_b8' is not available without Dassl.*efficientnet_b0 to _b7"
    ):
        build_backbone("efficientnet_b8")  # (EfficientNet-PyTorch's b8: Dassl registers b0 to b7)
    with pytest.raises(DAELConfigError, match="is not a file"):
        build_backbone("timm_resnet18", pretrained=True, weights_file="/nonexistent.pth")


@pytest.mark.dassl
def test_registry_order_is_dassls_build_order():
    """The one registry holds Dassl's pipeline order: every Dassl name ``_build_transform_train``
    tests for, in the order it tests them (a reordered or missing entry fails here)."""
    import inspect
    import re

    from dassl.data.transforms import transforms as dt

    from dael_plugin.transforms.registry import REGISTRY

    dassl_order = list(
        dict.fromkeys(re.findall(r'if "(\w+)" in choices', inspect.getsource(dt._build_transform_train)))
    )
    ours = [t.name for t in REGISTRY if t.name in dassl_order]
    assert ours == dassl_order
    assert set(dassl_order) <= {t.name for t in REGISTRY}
