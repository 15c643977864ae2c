"""ViT-like timm encoders at the dataset's size (``backbones/timm_backbone.py::create_at_size``), a
weights file made for another size resampled as timm does, the one line for a size a model cannot
take, the fused pass on a backbone without batch norm, and the weights a record names
(``engine/results_reader.weights_identity``: collect keeps other weights in other rows)."""

import json
import os

import pytest
import torch

from conftest import ROOT, run_here
from steps import strategy

VIT = "vit_tiny_patch16_224"


def test_a_vit_is_built_for_the_input_size_and_its_224_weights_resampled(tmp_path, capsys):
    import timm

    from dael_plugin.backbones import build_backbone

    net = build_backbone(f"timm_{VIT}", img_size=(32, 32))
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 192) and net.out_features == 192
    assert tuple(net.model.pos_embed.shape) == (1, 1 + 2 * 2, 192)  # a 2x2 grid of 16-pixel patches, and CLS
    made = timm.create_model(VIT, num_classes=0)  # at 224: 14x14 positions
    path = tmp_path / "vit224.pth"
    torch.save(made.state_dict(), path)
    net = build_backbone(f"timm_{VIT}", weights_file=str(path), img_size=(32, 32))
    said = capsys.readouterr().out
    assert "resampled to this input size, as timm does: pos_embed" in said
    torch.testing.assert_close(net.model.patch_embed.proj.weight, made.patch_embed.proj.weight, rtol=0, atol=0)
    from timm.layers import resample_abs_pos_embed

    want = resample_abs_pos_embed(made.pos_embed, new_size=(2, 2), num_prefix_tokens=1)
    torch.testing.assert_close(net.model.pos_embed, want)
    # a convolutional model takes the size as it is (no img_size argument)
    assert build_backbone("timm_resnet18", img_size=(32, 32)).out_features == 512


def test_a_size_the_model_cannot_take_is_one_line():
    from dael_plugin.backbones import build_backbone
    from dael_plugin.errors import DAELConfigError

    with pytest.raises(DAELConfigError) as info:
        build_backbone(f"timm_{VIT}", img_size=(8, 8))
    said = str(info.value)
    assert "\n" not in said and "does not take INPUT.SIZE 8x8" in said and 'set INPUT.SIZE "[224, 224]"' in said
    # timm builds a ViT/16 for 30x30 and reads its top-left 16x16 pixels alone, without a word
    with pytest.raises(
        DAELConfigError, match=r'the top-left 16x32 pixels of each image and drop the rest; set INPUT.SIZE "\[32, 32\]"'
    ):
        build_backbone(f"timm_{VIT}", img_size=(30, 32))


@pytest.mark.parametrize(
    "engine, backbone",
    [
        ("builtin", VIT),
        pytest.param("dassl", VIT, marks=pytest.mark.dassl),
    ],
)
def test_dael_trains_a_tiny_vit_at_32x32(tmp_path, tiny_root, engine, backbone):
    """A ViT trains DAEL for an epoch at the embedded set's size, on both engines. The CLIP tower
    (85.7M parameters: 22 s of the suite an epoch) is built for 32x32 and takes DAEL's step in
    test_each_encoder_family_takes_a_dael_step_at_32x32, and its shipped configs build in
    test_every_shipped_configs_backbone_builds_at_its_size: the same build_backbone and step as here."""
    proc = run_here(
        ["--engine", engine, "--trainer", "DAEL", "--root", tiny_root, "--output-dir", str(tmp_path / "run"),
         "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
         "--config-file", os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
         "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
         "MODEL.BACKBONE.NAME", f"timm_{backbone}", "OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0",
         "SELECTION.EVAL_FREQ", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["backbone"] == f"timm_{backbone}" and record["engine"] == engine
    assert record["backbone_weights"]["read"] is None  # PRETRAINED False: a random start, said so
    if engine == "builtin":  # the plugin's fused pass (the Dassl engine's DAEL is the plugin's too)
        assert "per-domain statistics do not apply: the fused pass is one plain call" in proc.stdout


def _record(weights, path="x/results.json", file_key=""):
    import yaml

    from dael_plugin.engine.results_reader import Record

    config = {"TRAINER": {"NAME": "DAEL"}, "MODEL": {"BACKBONE": {"WEIGHTS": file_key}}}
    data = {"engine": "builtin", "backbone_weights": weights, "provenance": {"config": yaml.safe_dump(config)}}
    return Record(path, data)


def test_runs_of_other_weights_are_other_settings_and_a_moved_file_is_not():
    from dael_plugin.engine.results_reader import setting_items, setting_key

    a = _record({"file": "/a/w.pth", "sha256": "1" * 64}, file_key="/a/w.pth")
    moved = _record({"file": "/b/w.pth", "sha256": "1" * 64}, file_key="/b/w.pth")
    other = _record({"file": "/a/w.pth", "sha256": "2" * 64}, file_key="/a/w.pth")
    assert setting_key(a) == setting_key(moved)  # the same file, elsewhere
    assert setting_key(a) != setting_key(other)  # the same name, other contents
    assert setting_items(other)["weights"] == "sha256:" + "2" * 12
    v1 = _record({"timm": "resnet50.tv_in1k", "tag": "tv_in1k"})
    v2 = _record({"timm": "resnet50.tv2_in1k", "tag": "tv2_in1k"})
    assert setting_key(v1) != setting_key(v2)  # torchvision's V1 and V2 ImageNet weights
    assert setting_items(_record({"read": None, "why": "MODEL.BACKBONE.PRETRAINED False"}))["weights"] == "random"


def _cfg(tmp_path, *opts, config=None, engine="builtin"):
    from dael_plugin.tools.train import build_parser, setup_cfg

    argv = ["--engine", engine, "--trainer", "DAEL", "--root", str(tmp_path), "--seed", "1"]
    argv += ["--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")]
    argv += ["--config-file", config or os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")]
    return setup_cfg(build_parser().parse_args(argv + ["--", *opts]), engine)


CLIP = "timm_vit_base_patch16_clip_quickgelu_224.openai"
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def test_pixel_stats_auto_are_the_weights_own_and_the_last_setting_wins(tmp_path):
    """``auto`` is the pretrained_cfg's mean and std (CLIP's here, not ImageNet's); the numbers are
    written into the config; a file's ``auto`` gives way to numbers given after it, and back."""
    import yaml

    from dael_plugin.tools import pixel_stats

    cfg = _cfg(tmp_path, "MODEL.BACKBONE.NAME", CLIP, "INPUT.PIXEL_MEAN", "auto", "INPUT.PIXEL_STD", "auto")
    assert list(cfg.INPUT.PIXEL_MEAN) == CLIP_MEAN and list(cfg.INPUT.PIXEL_STD) == CLIP_STD
    assert yaml.safe_load(cfg.dump())["INPUT"]["PIXEL_MEAN"] == CLIP_MEAN  # what results.json records
    # Dassl's ResNet-18 reads torchvision's weights: ImageNet's std; the mean, not set to auto, is the file's
    tv = _cfg(tmp_path, "MODEL.BACKBONE.NAME", "resnet18", "INPUT.PIXEL_STD", "auto")
    assert list(tv.INPUT.PIXEL_STD) == [0.229, 0.224, 0.225] and list(tv.INPUT.PIXEL_MEAN) == [0.5, 0.5, 0.5]
    method = tmp_path / "auto.yaml"
    with open(os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")) as f:
        method.write_text(f.read() + "\nINPUT:\n  PIXEL_MEAN: auto\n  PIXEL_STD: auto\n")
    from_file = _cfg(tmp_path, "MODEL.BACKBONE.NAME", CLIP, config=str(method))
    assert list(from_file.INPUT.PIXEL_MEAN) == CLIP_MEAN
    later = _cfg(tmp_path, "MODEL.BACKBONE.NAME", CLIP, "INPUT.PIXEL_MEAN", "[0.1, 0.2, 0.3]", config=str(method))
    assert list(later.INPUT.PIXEL_MEAN) == [0.1, 0.2, 0.3] and list(later.INPUT.PIXEL_STD) == CLIP_STD
    # the log line: the weights' own, or a warning naming theirs (only where pretrained weights are read)
    later.defrost()
    later.MODEL.BACKBONE.PRETRAINED = True
    said = pixel_stats.note(later)
    assert said.startswith("warning: INPUT.PIXEL_MEAN [0.1, 0.2, 0.3]") and "set INPUT.PIXEL_MEAN auto" in said
    assert "vit_base_patch16_clip_quickgelu_224.openai" in said and "[0.4815, 0.4578, 0.4082]" in said
    later.INPUT.PIXEL_MEAN = CLIP_MEAN
    assert pixel_stats.note(later).startswith("Pixels normalised with the weights' own mean [0.4815")
    later.MODEL.BACKBONE.PRETRAINED = False
    assert pixel_stats.note(later) is None  # a random start has no weights' own


def test_pixel_stats_auto_for_a_backbone_without_pretrained_config_is_one_line(tmp_path):
    from dael_plugin.errors import DAELConfigError

    with pytest.raises(DAELConfigError) as info:
        _cfg(tmp_path, "INPUT.PIXEL_MEAN", "auto")  # the plugin's small CNN: no pretrained_cfg
    said = str(info.value)
    assert "\n" not in said and said.startswith("INPUT.PIXEL_MEAN auto: MODEL.BACKBONE.NAME dael_small_cnn has no")


@pytest.mark.dassl
def test_pixel_stats_auto_on_the_dassl_engine(tmp_path):
    """Dassl's config (``get_cfg_default``) takes ``auto`` as the built-in one does."""
    cfg = _cfg(tmp_path, "MODEL.BACKBONE.NAME", CLIP, "INPUT.PIXEL_MEAN", "auto", engine="dassl")
    assert list(cfg.INPUT.PIXEL_MEAN) == CLIP_MEAN and list(cfg.INPUT.PIXEL_STD) == [0.5, 0.5, 0.5]


def _hub_cache(root, model="test_resnet.r160_in1k"):
    """A Hugging Face cache holding timm's ``model`` (random weights in timm's layout), as
    ``huggingface_hub`` lays it out: ``models--timm--<model>/{refs/main, snapshots/<rev>/}``."""
    import timm
    from safetensors.torch import save_file

    repo = os.path.join(str(root), "hub", f"models--timm--{model}")
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(os.path.join(repo, "snapshots", "0" * 40))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0" * 40)
    torch.manual_seed(7)
    state = {k: v.contiguous() for k, v in timm.create_model(model.split(".")[0]).state_dict().items()}
    path = os.path.join(repo, "snapshots", "0" * 40, "model.safetensors")
    save_file(state, path)
    return path, state


def _offline_env(home):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "TORCH_HOME": str(home / "torch")}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return env


def _pretrained_run(tmp_path, tiny_root, env, out="run"):
    import subprocess
    import sys

    args = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--engine", "builtin", "--trainer", "DAEL",
            "--root", tiny_root, "--output-dir", str(tmp_path / out),
            "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
            "--config-file", os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
            "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
            "MODEL.BACKBONE.NAME", "timm_test_resnet", "MODEL.BACKBONE.PRETRAINED", "True", "OPTIM.MAX_EPOCH", "1",
            "DATALOADER.NUM_WORKERS", "0", "SELECTION.EVAL_FREQ", "0", "INPUT.PIXEL_MEAN", "auto",
            "INPUT.PIXEL_STD", "auto", "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8"]  # fmt: skip
    env = {**env, "DAEL_PLUGIN_HIDE_DASSL": "1", "PYTHONPATH": ROOT}
    return subprocess.run(args, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)


def test_offline_with_no_local_weights_is_one_line_naming_the_file_and_the_cache(tmp_path, tiny_root):
    """``HF_HUB_OFFLINE=1`` set in the shell (before the hub library is imported) and an empty
    cache: the run stops at once, naming the file it expected and the folder it searched."""
    proc = _pretrained_run(tmp_path, tiny_root, _offline_env(tmp_path / "home"))
    assert proc.returncode != 0
    said = proc.stderr.strip()
    assert "\n" not in said and "Traceback" not in said, said[-2000:]
    assert "timm/test_resnet.r160_in1k/model.safetensors" in said and "HF_HUB_OFFLINE is set" in said
    assert f"the Hugging Face cache {tmp_path / 'home' / 'hub'}" in said
    assert not (tmp_path / "run").exists()  # said before the output folder is made


def test_offline_with_weights_in_the_cache_reads_and_records_them(tmp_path, tiny_root):
    """The second place the weights are resolved from: timm's file in the Hugging Face cache, read
    offline. ``results.json`` and the checkpoint name the model, its tag, the source and the
    file's sha256; normalisation ``auto`` is the model's own. (timm's ``test_resnet``, 0.4M
    parameters, has a pretrained tag as the large models do.)"""
    import hashlib

    from dael_plugin.engine.checkpoint import load_checkpoint

    path, _ = _hub_cache(tmp_path / "home")
    proc = _pretrained_run(tmp_path, tiny_root, _offline_env(tmp_path / "home"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    want = {"timm": "test_resnet", "tag": "r160_in1k", "source": "cache", "file": os.path.realpath(path), "sha256": sha}
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["backbone_weights"] == want
    assert load_checkpoint(str(tmp_path / "run" / "checkpoint.pth.tar"))["backbone_weights"] == want
    assert "Pixels normalised with the weights' own mean [0.5, 0.5, 0.5]" in proc.stdout


def test_weights_from_the_hub_cache_are_the_files_and_a_resume_onto_other_weights_is_refused(tmp_path, monkeypatch):
    """In-process: a pretrained build reads the cached file's tensors (not a random start); a
    checkpoint whose file now holds other bytes does not resume."""
    from huggingface_hub import constants
    from yacs.config import CfgNode as CN

    from dael_plugin.backbones import build_backbone
    from dael_plugin.backbones.record import weights_record
    from dael_plugin.engine.checkpoint import CheckpointError, check_same_weights

    path, state = _hub_cache(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    net = build_backbone("timm_test_resnet", pretrained=True)
    for k, v in net.model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    rec = weights_record("timm_test_resnet", True, "")
    assert rec["source"] == "cache" and rec["file"] == os.path.realpath(path)
    cfg = CN({"MODEL": CN({"BACKBONE": CN({"NAME": "timm_test_resnet", "PRETRAINED": True, "WEIGHTS": ""})})})
    check_same_weights({"backbone_weights": rec, "engine": "builtin"}, cfg, "ckpt")  # the same bytes: resumes
    with pytest.raises(CheckpointError, match="now holds others") as info:
        check_same_weights({"backbone_weights": {**rec, "sha256": "f" * 64}, "engine": "builtin"}, cfg, "ckpt")
    assert "\n" not in str(info.value)


def test_channels_last_is_skipped_for_a_vit_in_one_line(capsys):
    """A ViT's one convolution is its patch embedding: no channels_last, one line; a ResNet's
    convolutions still take it."""
    from dael_plugin.backbones import build_backbone
    from dael_plugin.engine import execution as ex

    vit = build_backbone(f"timm_{VIT}", img_size=(32, 32))
    assert not ex.use_channels_last(vit, (3, 32, 32), torch.device("cpu"), VIT)
    said = capsys.readouterr().out
    assert said.count("CHANNELS_LAST does not apply to vit_tiny_patch16_224: its only convolution is a patch") == 1
    assert vit.model.patch_embed.proj.weight.is_contiguous()
    assert ex.use_channels_last(build_backbone("timm_resnet18"), (3, 32, 32), torch.device("cpu"))


def _vit_model(dev, k=3, c=5):
    from dael_plugin.backbones import build_backbone
    from dael_plugin.core import DAELHparams, build_heads

    torch.manual_seed(0)
    net = build_backbone(f"timm_{VIT}", img_size=(32, 32))
    return net.to(dev), build_heads(net.out_features, c, k, DAELHparams(conf_thre=0.0)).to(dev)


@pytest.mark.parametrize("setting", ["da", "dg"])
def test_a_vit_step_on_the_meta_device_mixes_no_cpu_tensor(setting):
    """A ViT's step (LayerNorm only: the fused pass is one plain call) with every tensor on a
    non-CPU device: forward, backward and the optimiser step; a CPU tensor in the math raises (the
    position embeddings, the class token and attention's masks included)."""
    from test_gpu_stand_ins import _batches

    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine.step import DAELStep

    dev = torch.device("meta")
    net, heads = _vit_model(dev)
    algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="grouped")
    opt = torch.optim.AdamW(list(net.parameters()) + list(heads.parameters()), lr=1e-4)
    da = setting == "da"
    out = DAELStep(algo, [opt], strategy(dev), 3, 4, da)(*_batches()[: 2 if da else 1], *([] if da else [None]))
    assert all(v.device.type == "meta" for v in out.values()) and ("loss_u" in out) == da
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in net.parameters())


def test_a_vit_steps_losses_on_fake_cuda_tensors(monkeypatch):
    """The ViT step's forward pass and losses on fake CUDA tensors, built on CUDA as the engines
    build it (``CHUNK_BN auto`` -> grouped, the fused AdamW). The backward needs a real CUDA context."""
    from test_gpu_stand_ins import _batches, split_on_the_host
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine import step as step_module
    from dael_plugin.engine.execution import fused_optimizer

    split_on_the_host(monkeypatch)
    x, u = _batches()
    net, heads = _vit_model(torch.device("cpu"))  # (timm's constructor reads values: built on the CPU)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cuda"):
        dev = torch.device("cuda")
        net, heads = net.to(dev), heads.to(dev)  # every parameter and buffer a fake CUDA tensor
        assert all(t.is_cuda for t in [*net.parameters(), *net.buffers(), *heads.parameters()])
        algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="auto")
        opt = fused_optimizer(torch.optim.AdamW(list(net.parameters()) + list(heads.parameters()), lr=1e-4))
        assert opt.param_groups[0]["fused"]
        step = step_module.DAELStep(algo, [opt], strategy(dev, check_first_step=False), 3, 4, True)
        out, us = step.losses(x, u)
        assert all(v.is_cuda for v in out.values()) and us is not None
        assert net.model.pos_embed.is_cuda and all(k in out for k in step.keys)


def _shipped_pairs():
    """(trainer config, its dataset config) for every shipped trainer config: the dataset config
    of the same setting whose name the trainer config's begins with (``mini_domainnet_vit_small``
    -> ``mini_domainnet``), the longest such."""
    import glob

    pairs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "trainers", "*", "*", "*.yaml"))):
        setting, stem = path.split(os.sep)[-3], os.path.basename(path)[:-5]
        names = [
            os.path.basename(d)[:-5] for d in glob.glob(os.path.join(ROOT, "configs", "datasets", setting, "*.yaml"))
        ]
        name = max((n for n in names if stem == n or stem.startswith(n + "_")), key=len)
        pairs.append((path, os.path.join(ROOT, "configs", "datasets", setting, name + ".yaml")))
    return pairs


def test_every_shipped_configs_backbone_builds_at_its_size(tmp_path):
    """Each shipped trainer config with its dataset config, merged as ``train.py`` merges them: its
    backbone (weights off) is built for ``INPUT.SIZE`` and takes a batch of that size; a ViT or
    CLIP config's normalisation is its weights' own (what ``auto`` gives)."""
    from dael_plugin.backbones import DASSL_CNNS, build_backbone, pretrained_stats
    from dael_plugin.methods import trainer_names
    from dael_plugin.tools.sweep_plan import _snake
    from dael_plugin.tools.train import build_parser, setup_cfg

    pairs, built = _shipped_pairs(), {}
    assert len(pairs) >= 38 and any("clip_vit_b16" in p for p, _ in pairs)
    for method, dataset in pairs:
        name = os.path.basename(os.path.dirname(method))
        trainer = {_snake(t): t for t in trainer_names()}[name]  # (a config folder is its trainer's snake_case name)
        argv = ["--engine", "builtin", "--trainer", trainer, "--root", str(tmp_path), "--seed", "1",
                "--dataset-config-file", dataset, "--config-file", method,
                "--", "MODEL.BACKBONE.PRETRAINED", "False"]  # (no weights here: the pretrained ones are checked below)  # fmt: skip
        cfg = setup_cfg(build_parser().parse_args(argv), "builtin")
        size = tuple(int(v) for v in cfg.INPUT.SIZE)
        key = (str(cfg.MODEL.BACKBONE.NAME), size)
        if key not in built:
            net = build_backbone(key[0], img_size=size)
            net.eval()
            with torch.no_grad():
                out = net(torch.zeros(2, 3, *size))
            built[key] = (out.shape, net.out_features)
        shape, features = built[key]
        assert shape == (2, features), (method, key)
        if "vit" in os.path.basename(method):
            assert key[0].startswith("timm_vit") and size == (224, 224) and "PRETRAINED: True" in open(method).read()
            mean, std, _ = pretrained_stats(key[0])  # what INPUT.PIXEL_MEAN auto gives, written out
            assert (list(cfg.INPUT.PIXEL_MEAN), list(cfg.INPUT.PIXEL_STD)) == (mean, std), method
            assert mean == (CLIP_MEAN if "clip" in key[0] else [0.5, 0.5, 0.5])
            assert features == (768 if "clip" in key[0] else 384)  # CLIP's pre-projection features, not its 512
    assert {k[0] for k in built} >= {
        "cnn_digitsdg",
        "resnet18",
        "timm_vit_small_patch16_224.augreg_in21k_ft_in1k",
        CLIP,
    }
    # Dassl's digit networks at their 32x32; its WideResNet (global pooling) also at STL-10's 96x96, as Dassl's config
    assert not any(k[0] in DASSL_CNNS and k[1] != (32, 32) and k != ("wide_resnet_28_2", (96, 96)) for k in built)


FAMILIES = [
    "timm_deit_tiny_patch16_224",  # DeiT
    "timm_swin_tiny_patch4_window7_224",  # Swin (windows fitted to the size by timm)
    "timm_convnext_atto",  # ConvNeXt (LayerNorm)
    "timm_eva02_tiny_patch14_224",  # EVA-02 (rotary position embeddings), at 28x28: whole 14x14 patches
    "timm_vit_base_patch16_clip_quickgelu_224.openai",  # CLIP's image tower, QuickGELU
]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_encoder_family_takes_a_dael_step_at_32x32(name):
    """DeiT, Swin, ConvNeXt, EVA and a CLIP tower, each built for the embedded set's 32x32 and run
    through DAEL's fused step (no batch norm in any: one plain call), with a gradient in every
    parameter that the loss reaches and finite losses; the CLIP tower's features are its 768
    before the projection."""
    from test_gpu_stand_ins import _batches

    from dael_plugin.backbones import build_backbone
    from dael_plugin.core import DAEL, DAELHparams, build_heads
    from dael_plugin.engine.step import DAELStep

    torch.manual_seed(0)
    size = 28 if "patch14" in name else 32
    net = build_backbone(name, img_size=(size, size))
    heads = build_heads(net.out_features, 5, 3, DAELHparams(conf_thre=0.0))
    algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True)
    opt = torch.optim.AdamW(list(net.parameters()) + list(heads.parameters()), lr=1e-4)
    before = [p.detach().clone() for p in net.parameters()]
    out = DAELStep(algo, [opt], strategy(), 3, 4, True)(*_batches(size=size))
    assert all(torch.isfinite(v) for v in out.values()) and "loss_u" in out
    assert sum(not torch.equal(b, p) for b, p in zip(before, net.parameters())) > len(before) // 2
    if "clip" in name:
        assert net.out_features == 768


@pytest.mark.dassl
def test_dassls_own_baseline_trains_a_vit_at_32x32_on_the_dassl_engine(tmp_path, tiny_root):
    """Dassl's own MME builds the ViT through Dassl's ``build_backbone`` (the plugin's registered
    factory carries INPUT.SIZE) and trains an epoch."""
    proc = run_here(
        ["--engine", "dassl", "--trainer", "MME", "--root", tiny_root, "--output-dir", str(tmp_path / "run"),
         "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
         "--config-file", os.path.join(ROOT, "configs/trainers/da/mme/embedded_digits.yaml"),
         "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
         "MODEL.BACKBONE.NAME", f"timm_{VIT}", "OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0",
         "SELECTION.EVAL_FREQ", "0"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["trainer"] == "MME" and record["engine"] == "dassl" and record["backbone"] == f"timm_{VIT}"
