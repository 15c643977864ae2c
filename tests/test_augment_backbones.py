import numpy as np
import pytest
import torch
from PIL import Image

from dael_plugin import add_dael_config
from dael_plugin.backbones import TimmBackbone, build_backbone
from dael_plugin.builtin.defaults import get_builtin_cfg
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


def test_timm_pretrained_from_local_file(tmp_path):
    import timm

    torch.manual_seed(1)
    src = timm.create_model("resnet18", pretrained=False, num_classes=10)
    path = tmp_path / "w.pth"
    torch.save(src.state_dict(), path)
    b = build_backbone("timm_resnet18", pretrained=True, weights_file=str(path))
    torch.testing.assert_close(b.model.conv1.weight, src.conv1.weight)
    random_b = build_backbone("timm_resnet18", pretrained=False)
    assert not torch.equal(random_b.model.conv1.weight, src.conv1.weight)


def test_unknown_backbones_are_one_line_errors():
    with pytest.raises(DAELConfigError, match="timm has no model 'resnet181'.*did you mean timm_resnet18"):
        build_backbone("timm_resnet181")
    with pytest.raises(DAELConfigError, match="not available without Dassl"):
        build_backbone("cnn_digitsingle")  # a Dassl backbone not rebuilt here
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
