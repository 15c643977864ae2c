"""The fused backbone pass with per-chunk batch-norm statistics against one call per chunk
(CPU, fp32): features, gradients and running statistics agree."""
import copy

import pytest
import torch
from torch import nn

from dael_plugin.backbones import build_backbone
from dael_plugin.core import DAEL, DAELHparams, ExpertHeads
from dael_plugin.core.chunk_norm import per_chunk_batch_norm, unfusable_reason


def _compare(net, x, k, grad_out=None):
    a, b = copy.deepcopy(net).train(), copy.deepcopy(net).train()
    fa = torch.cat([a(c) for c in x.split(x.shape[0] // k)])
    with per_chunk_batch_norm(b, k):
        fb = b(x)
    g = torch.randn_like(fa) if grad_out is None else grad_out
    (fa * g).sum().backward()
    (fb * g).sum().backward()
    return a, b, fa, fb


def _assert_same(a, b, fa, fb):
    torch.testing.assert_close(fb, fa, atol=1e-5, rtol=1e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        # Relative to the layer's gradient scale: float sums in another order.
        scale = max(pa.grad.abs().max().item(), 1.0)
        assert (pa.grad - pb.grad).abs().max().item() <= 1e-5 * scale, name
    for (name, ba), bb in zip(a.named_buffers(), b.buffers()):
        torch.testing.assert_close(bb.float(), ba.float(), atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name,size", [("dael_small_cnn", 32), ("timm_resnet18", 32), ("timm_convnext_atto", 32)])
def test_fused_pass_equals_one_call_per_chunk(name, size):
    torch.manual_seed(0)
    net = build_backbone(name, pretrained=False)
    x = torch.randn(3 * 8, 3, size, size)
    a, b, fa, fb = _compare(net, x, 3)
    _assert_same(a, b, fa, fb)
    nbt = [m.num_batches_tracked.item() for m in b.modules() if isinstance(m, nn.BatchNorm2d)]
    assert set(nbt) <= {3}  # three updates, as three calls make (ConvNeXt has no batch norm)


def test_batchnorm1d_and_running_stats_in_closed_form():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6, momentum=0.3), nn.ReLU(), nn.Linear(6, 4))
    x = torch.randn(4 * 6, 5) * 3 + 1
    a, b, fa, fb = _compare(net, x, 4)
    _assert_same(a, b, fa, fb)
    # By hand for the first chunk's effect: four sequential updates from (0, 1).
    h = net[0](x).detach()
    rm = torch.zeros(6)
    for c in h.split(6):
        rm = 0.7 * rm + 0.3 * c.mean(0)
    torch.testing.assert_close(b[1].running_mean, rm, atol=1e-6, rtol=0)


def test_eval_mode_is_unchanged_and_the_patch_is_removed():
    torch.manual_seed(0)
    net = build_backbone("dael_small_cnn").eval()
    x = torch.randn(12, 3, 32, 32)
    with torch.no_grad():
        ref = net(x)
        with per_chunk_batch_norm(net, 3):
            fused = net(x)
    torch.testing.assert_close(fused, ref, atol=0, rtol=0)
    assert all("forward" not in m.__dict__ for m in net.modules())


def test_modules_it_cannot_fuse_are_named():
    assert unfusable_reason(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))) is None
    assert "SyncBatchNorm" in unfusable_reason(nn.Sequential(nn.SyncBatchNorm(4)))
    assert "momentum=None" in unfusable_reason(nn.Sequential(nn.BatchNorm2d(4, momentum=None)))
    # timm's norm+activation layers are BatchNorm2d subclasses with more in their forward.
    assert "BatchNormAct2d" in unfusable_reason(build_backbone("timm_efficientnet_b0"))
    with pytest.raises(ValueError, match="cannot fuse"):
        with per_chunk_batch_norm(nn.Sequential(nn.SyncBatchNorm(4)), 2):
            pass


def test_dael_losses_and_update_are_the_same_with_fuse_chunks(capsys):
    """The whole DAEL step (3 domain chunks, 2 views, target batch) with and
    without FUSE_CHUNKS: losses, parameters after an SGD step, running statistics."""
    torch.manual_seed(0)
    backbone = build_backbone("dael_small_cnn")
    heads = ExpertHeads(backbone.out_features, 10, 3)
    hp = DAELHparams(conf_thre=0.0)
    x_views = [torch.randn(24, 3, 32, 32), torch.randn(24, 3, 32, 32)]
    u_views = [torch.randn(8, 3, 32, 32), torch.randn(8, 3, 32, 32)]
    labels = torch.randint(0, 10, (24,))
    expert = torch.arange(3).repeat_interleave(8)
    results = []
    for fuse in (False, True):
        f, h = copy.deepcopy(backbone), copy.deepcopy(heads)
        alg = DAEL(f, h, hp, fuse_chunks=fuse)
        opt = torch.optim.SGD(list(f.parameters()) + list(h.parameters()), lr=0.1, momentum=0.9)
        out = alg.losses(x_views, labels, expert, [8, 8, 8], u_views)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        results.append((out, f.state_dict(), h.state_dict()))
    (o0, f0, h0), (o1, f1, h1) = results
    for k in ("loss", "loss_x", "loss_cr", "loss_u"):
        assert abs(o0[k].item() - o1[k].item()) < 1e-5, k
    for k in f0:
        torch.testing.assert_close(f1[k].float(), f0[k].float(), atol=1e-5, rtol=1e-5)
    for k in h0:
        torch.testing.assert_close(h1[k], h0[k], atol=1e-5, rtol=1e-5)


def test_a_backbone_it_cannot_fuse_falls_back_with_one_line(capsys):
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.BatchNorm1d(6, momentum=None))
    alg = DAEL(net, ExpertHeads(6, 3, 2), DAELHparams(), fuse_chunks=True)
    x = torch.randn(8, 3, 2, 2)
    ref = torch.cat([net(c) for c in x.split(4)])
    net2 = copy.deepcopy(net)
    alg.featurizer = net2
    alg.encode(x, [4, 4])
    alg.encode(x, [4, 4])
    out = capsys.readouterr().out
    assert out.count("falls back to one backbone call per domain chunk") == 1 and "momentum=None" in out
    assert ref.shape == (8, 6)


def test_fuse_chunks_key_reaches_the_algorithm(tmp_path, tiny_root, capsys, monkeypatch):
    from dael_plugin.builtin import trainer as bt
    from test_hardening import args_for, cli

    seen = []
    real = bt.DAEL.__init__

    def spy(self, *a, **k):
        seen.append(k.get("fuse_chunks"))
        real(self, *a, **k)

    monkeypatch.setattr(bt.DAEL, "__init__", spy)
    code, _, err = cli(args_for(tiny_root, tmp_path / "f", extra=["TRAINER.DAEL.FUSE_CHUNKS", "True"]), capsys)
    assert code == 0, err
    assert seen == [True]
