"""DAEL under category shift (core/category_shift.py): the masks and losses against hand-worked
numbers, and the exact reduction to the paper's losses when every domain holds every class."""

import math
import os

import pytest
import torch

from dael_plugin.core.category_shift import (
    NEG,
    agreed_labels,
    class_ensemble,
    mask_logits,
    shared_consistency,
)
from dael_plugin.core.hparams import DAELHparams
from dael_plugin.core.losses import balanced_u_loss, dael_losses, ensemble_probs, pseudo_labels

T, F_ = True, False


def test_the_per_class_ensemble_by_hand():
    """Expert 0 knows classes {0, 1}, expert 1 knows {1, 2}: class 0 is expert 0's alone, class 2
    expert 1's alone, class 1 the mean of both; then renormalised. The plain mean would halve the
    classes that one source holds."""
    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    probs = torch.tensor([[[0.6, 0.4, 0.0], [0.0, 0.2, 0.8]]])
    per_class = torch.tensor([0.6, 0.3, 0.8])
    torch.testing.assert_close(class_ensemble(probs, mask), (per_class / per_class.sum())[None])
    assert class_ensemble(probs, mask).argmax().item() == 2  # the plain mean ties 0.3 / 0.3 / 0.4 less sharply
    full = torch.ones(2, 3, dtype=torch.bool)
    torch.testing.assert_close(class_ensemble(probs, full), probs.mean(1))


def test_shared_consistency_by_hand():
    """Three experts; domain 0 holds {0, 1, 2}, domain 1 {0, 1}, domain 2 {1, 2}. For a sample of
    domain 0 with target t = (0.5, 0.3, 0.2): the others' per-class mean is (0.6, (0.4 + 0.1) / 2,
    0.9) = (0.6, 0.25, 0.9), renormalised (12, 5, 18) / 35; t is already normalised (17.5, 10.5,
    7) / 35; squared error (5.5² + 5.5² + 11²) / 35² = 181.5 / 1225."""
    mask = torch.tensor([[T, T, T], [T, T, F_], [F_, T, T]])
    probs = torch.tensor([[[1 / 3, 1 / 3, 1 / 3], [0.6, 0.4, 0.0], [0.0, 0.1, 0.9]]])
    target = torch.tensor([[0.5, 0.3, 0.2]])
    got = shared_consistency(target, probs.log(), torch.tensor([0]), mask)
    assert got.item() == pytest.approx(181.5 / 1225, rel=1e-6)
    # a sample of domain 1: its classes {0, 1}; expert 2 knows class 1 only, expert 0 both, so
    # the others' mean is (1/3, (1/3 + 0.1) / 2) over {0, 1}, renormalised; t = (0.7, 0.3, 0)
    t1 = torch.tensor([[0.7, 0.3, 0.0]])
    ens = torch.tensor([1 / 3, (1 / 3 + 0.1) / 2])
    ens = ens / ens.sum()
    want = (ens[0] - 0.7) ** 2 + (ens[1] - 0.3) ** 2
    assert shared_consistency(t1, probs.log(), torch.tensor([1]), mask).item() == pytest.approx(want.item(), rel=1e-6)


def test_a_domain_sharing_no_class_adds_nothing_to_l_cr():
    mask = torch.tensor([[T, T, F_, F_], [F_, F_, T, T]])
    probs = torch.softmax(torch.randn(2, 2, 4), -1)
    target = torch.softmax(torch.randn(2, 4), -1)
    assert shared_consistency(target, probs.log(), torch.tensor([0, 1]), mask).item() == 0.0


def test_a_label_no_other_expert_knows_adds_nothing_to_l_cr():
    """``CR_TARGET label``: domain 0 holds {0, 1, 2}, domain 1 {1, 2}; expert 1 predicts (0, 1/4, 3/4).
    A sample of domain 0 labelled 0 (a class no other expert knows) has a target with no mass on the
    shared classes {1, 2}: it adds 0, and moves no other expert. One labelled 1: t = (0, 1, 0) against
    (0, 1/4, 3/4), so (3/4)^2 + (3/4)^2 = 9/8. The mean over the two is 9/16. (A zeroed target against
    the renormalised others gave the first sample (1/4)^2 + (3/4)^2 = 5/8, and the mean 7/8.)"""
    mask = torch.tensor([[T, T, T], [F_, T, T]])
    expert1 = torch.tensor([0.0, 0.25, 0.75])
    logits = torch.stack([torch.zeros(2, 3), expert1.clamp_min(1e-30).log().expand(2, 3)], 1).requires_grad_()
    onehot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    idx = torch.tensor([0, 0])
    got = shared_consistency(onehot, torch.log_softmax(logits, -1), idx, mask)
    assert got.item() == pytest.approx(9 / 16, rel=1e-6)
    got.backward()
    assert logits.grad[0].abs().max().item() == 0.0  # the class-0 sample moves nothing
    assert logits.grad[1, 1].abs().max().item() > 0
    only_unknown = shared_consistency(onehot[:1], torch.log_softmax(logits[:1].detach(), -1), idx[:1], mask)
    assert only_unknown.item() == 0.0
    kl = shared_consistency(onehot, torch.log_softmax(logits.detach(), -1), idx, mask, kind="kl")
    assert kl.item() == pytest.approx(-math.log(0.25) / 2, rel=1e-6)  # KL(t || ens) of the second sample, halved


@pytest.mark.parametrize("kind", ["mse", "kl"])
def test_l_cr_under_category_shift_in_fp16_itself(kind):
    """fp16 run directly (not fp32 converted afterwards): a domain that shares no class adds 0 (a clamp
    at 1e-12 underflowed to 0 in fp16 and gave 0 / 0 = NaN), and a shared case matches fp32 to fp16's
    rounding."""
    no_share = torch.tensor([[T, T, F_, F_], [F_, F_, T, T]])
    lp = torch.log_softmax(torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0)), -1).half()
    target = torch.softmax(torch.randn(2, 4, generator=torch.Generator().manual_seed(1)), -1).half()
    got = shared_consistency(target, lp, torch.tensor([0, 1]), no_share, kind)
    assert got.dtype == torch.float16 and got.item() == 0.0
    mask = torch.tensor([[T, T, T], [F_, T, T]])
    lp = torch.log_softmax(torch.tensor([[[0.0, 0.0, 0.0], [-9.0, 1.0, 2.0]]] * 2), -1)
    onehot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    want = shared_consistency(onehot, lp, torch.tensor([0, 0]), mask, kind)
    half = shared_consistency(onehot.half(), lp.half(), torch.tensor([0, 0]), mask, kind)
    assert torch.isfinite(half) and half.item() == pytest.approx(want.item(), rel=2e-3)
    assert torch.isfinite(class_ensemble(torch.zeros(1, 2, 4, dtype=torch.float16), no_share)).all()


def test_masked_experts_give_no_mass_and_no_gradient_to_classes_they_lack():
    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    logits = torch.randn(4, 2, 3, requires_grad=True)
    probs = torch.softmax(mask_logits(logits, mask), -1)
    assert (probs[:, 0, 2] == 0).all() and (probs[:, 1, 0] == 0).all()
    probs.sum().backward()  # the softmax rows sum to 1: use a loss that depends on the classes
    logits.grad = None
    loss = (torch.softmax(mask_logits(logits, mask), -1) * torch.arange(3.0)).sum()
    loss.backward()
    assert (logits.grad[:, 0, 2] == 0).all() and (logits.grad[:, 1, 0] == 0).all()
    for dtype in (torch.float16, torch.bfloat16):  # finite in low precision: no inf - inf, no NaN
        low = mask_logits(logits.detach().to(dtype), mask)
        assert torch.isfinite(low).all() and low[0, 0, 2].item() == pytest.approx(NEG, rel=1e-2)
        assert torch.isfinite(torch.log_softmax(low.float(), -1)).all()


def test_the_pseudo_label_comes_from_the_most_confident_expert_among_those_that_know_its_class():
    """Expert 1 is most confident of all on class 0, which its domain lacks: masked, that
    confidence goes, and expert 0 (which holds class 0) gives the label."""
    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    logits = torch.tensor([[[6.0, 0.0, 0.0], [12.0, 0.0, 1.0]]])
    naive, _, _ = pseudo_labels(torch.softmax(logits, -1), 0.9)
    labels, keep, conf = pseudo_labels(torch.softmax(mask_logits(logits, mask), -1), 0.9)
    assert naive.item() == 0 and labels.item() == 0
    assert conf.item() == pytest.approx(torch.softmax(torch.tensor([6.0, 0.0]), 0)[0].item())
    logits = torch.tensor([[[0.0, 0.5, 0.0], [9.0, 0.0, 3.0]]])  # expert 1's only confidence is masked away
    labels, keep, _ = pseudo_labels(torch.softmax(mask_logits(logits, mask), -1), 0.9)
    assert labels.item() == 2 and keep.item() == 1.0  # expert 1 over {1, 2}: 3 against 0, p = 0.953


def _batch(seed, k=3, c=5, n_per=4, m=6):
    g = torch.Generator().manual_seed(seed)
    n = k * n_per
    return (
        torch.randn(n, k, c, generator=g) * 2,
        torch.randn(n, k, c, generator=g) * 2,
        torch.randint(0, c, (n,), generator=g),
        torch.arange(k).repeat_interleave(n_per),
        torch.randn(m, 1, c, generator=g) * 10 + torch.randn(m, k, c, generator=g),  # experts mostly agree
        torch.randn(m, k, c, generator=g) * 2,
    )


@pytest.mark.parametrize(
    "switches",
    [{}, {"cr_loss": "kl"}, {"pseudo_label": "ensemble"}, {"cr_target": "label"}, {"conf_thre": 0.5}],
    ids=["paper", "kl", "ensemble pseudo-label", "label target", "threshold 0.5"],
)
def test_with_every_class_in_every_domain_the_losses_are_the_papers(switches):
    """All-True masks: the same losses and the same gradients as the paper's path (no mask), to
    float rounding (the renormalisations divide by sums that are 1)."""
    hp = DAELHparams(class_masks=("all",), **switches)
    assert hp.class_masks == ("experts", "ensemble", "cr", "pseudo_label")
    xt, xp, y, idx, ut, up = _batch(3)
    full = torch.ones(3, 5, dtype=torch.bool)
    outs, grads = [], []
    for mask in (None, full):
        leaves = [t.clone().requires_grad_() for t in (xt, xp, ut, up)]
        out = dael_losses(leaves[0], leaves[1], y, idx, hp, leaves[2], leaves[3], class_mask=mask)
        out["loss"].backward()
        outs.append(out)
        grads.append([t.grad for t in leaves])
    assert outs[0]["mask_u"].item() > 0  # L_u is on in this batch
    for key in ("loss", "loss_x", "loss_cr", "loss_u", "mask_u", "acc_x"):
        torch.testing.assert_close(outs[1][key], outs[0][key], rtol=1e-6, atol=1e-7)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ensemble_probs(xt, full), ensemble_probs(xt), rtol=1e-6, atol=1e-7)


def test_a_class_held_by_one_source_is_not_diluted_at_test_time():
    """The hand-worked case end to end: the naive mean of masked experts ranks class 0 (one
    source) below class 1 (both) even when expert 0 is sure of it; the per-class ensemble does not."""
    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    # expert 0 over {0, 1}: (0.7, 0.3); expert 1 over {1, 2}: (0.9, 0.1). Naive mean: (0.35, 0.6,
    # 0.05); per class: (0.7, 0.6, 0.1) / 1.4
    logits = torch.tensor([[[0.7, 0.3, 1.0], [1.0, 0.9, 0.1]]]).log()
    naive = torch.softmax(mask_logits(logits, mask), -1).mean(1)
    torch.testing.assert_close(ensemble_probs(logits, mask), torch.tensor([[0.5, 3 / 7, 1 / 14]]))
    assert naive.argmax().item() == 1
    assert ensemble_probs(logits, mask).argmax().item() == 0
    assert math.isclose(ensemble_probs(logits, mask).sum().item(), 1.0, rel_tol=1e-6)


def test_dael_losses_under_a_partial_mask_use_each_part_of_the_design():
    """With a real category shift, dael_losses' L_ce, L_cr and L_u are those of the masked logits,
    the shared-class L_cr and the per-class ensemble (each term recomputed from the parts)."""
    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    xt, xp, _, idx, ut, up = _batch(5)
    y = torch.tensor([0, 1, 2, 0] + [1, 2, 3, 3] + [0, 3, 4, 4])  # each domain's labels within its classes
    hp = DAELHparams(conf_thre=0.5, class_masks=("all",))
    out = dael_losses(xt, xp, y, idx, hp, ut, up, class_mask=mask)
    lt = torch.log_softmax(mask_logits(xt, mask), -1)
    own = lt[torch.arange(12), idx]
    torch.testing.assert_close(out["loss_x"], torch.nn.functional.nll_loss(own, y))
    lp = torch.log_softmax(mask_logits(xp, mask), -1)
    torch.testing.assert_close(out["loss_cr"], shared_consistency(own.exp(), lp, idx, mask))
    labels, keep, _ = pseudo_labels(torch.softmax(mask_logits(ut, mask), -1), 0.5)
    ens = class_ensemble(torch.softmax(mask_logits(up, mask), -1), mask)
    want_u = (torch.nn.functional.nll_loss(ens.log(), labels, reduction="none") * keep).mean()
    assert keep.sum() > 0
    torch.testing.assert_close(out["loss_u"], want_u)
    torch.testing.assert_close(out["loss"], out["loss_x"] + out["loss_cr"] + 0.5 * out["loss_u"])


PARTS = ("experts", "ensemble", "cr", "pseudo_label")


def _by_parts(xt, xp, y, idx, ut, up, mask, parts, conf_thre):
    """dael_losses' three terms rebuilt from the primitives, each part of the design on or off."""
    from dael_plugin.core.losses import consistency_loss

    nll = torch.nn.functional.nll_loss
    masked = (lambda lg: mask_logits(lg, mask)) if "experts" in parts else (lambda lg: lg)
    own = torch.log_softmax(masked(xt), -1)[torch.arange(len(y)), idx]
    lp = torch.log_softmax(masked(xp), -1)
    target = own.detach().exp()
    cr = shared_consistency(target, lp, idx, mask) if "cr" in parts else consistency_loss(target, lp, idx)
    probs_u = torch.softmax(masked(ut), -1)
    if "pseudo_label" in parts:
        probs_u = probs_u * mask  # each expert's candidate among its own classes
    labels, keep, _ = pseudo_labels(probs_u, conf_thre)
    pu = torch.softmax(masked(up), -1)
    ens = class_ensemble(pu, mask) if "ensemble" in parts else pu.mean(1)
    return nll(own, y), cr, (nll(ens.log(), labels, reduction="none") * keep).mean(), keep


@pytest.mark.parametrize(
    "parts", [(p,) for p in PARTS] + [("experts", "cr"), ("ensemble", "pseudo_label"), PARTS], ids=str
)
def test_each_part_of_class_masks_is_its_own_switch(parts):
    """``CLASS_MASKS`` lists the parts that are on: each changes its own term and nothing else
    (the unlisted parts stay the paper's), on a real category shift where every part matters."""
    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    xt, xp, _, idx, _, up = _batch(5)
    ut = torch.randn(6, 3, 5, generator=torch.Generator().manual_seed(5)) * 2  # experts disagree
    y = torch.tensor([0, 1, 2, 0] + [1, 2, 3, 3] + [0, 3, 4, 4])
    hp = DAELHparams(conf_thre=0.8, class_masks=parts)
    out = dael_losses(xt, xp, y, idx, hp, ut, up, class_mask=mask)
    loss_x, loss_cr, loss_u, keep = _by_parts(xt, xp, y, idx, ut, up, mask, parts, 0.8)
    assert 0 < keep.sum() < len(keep)
    torch.testing.assert_close(out["loss_x"], loss_x)
    torch.testing.assert_close(out["loss_cr"], loss_cr)
    torch.testing.assert_close(out["loss_u"], loss_u)
    torch.testing.assert_close(out["mask_u"], keep.mean())
    # each unlisted part would have changed a term (but 'pseudo_label', which masked experts imply)
    for other in [q for q in PARTS if q not in parts and not (q == "pseudo_label" and "experts" in parts)]:
        flipped = _by_parts(xt, xp, y, idx, ut, up, mask, parts + (other,), 0.8)
        assert any(not torch.allclose(a, b) for a, b in zip(flipped[:3], (loss_x, loss_cr, loss_u))), other
    want = ensemble_probs(mask_logits(xt, mask) if "experts" in parts else xt, None)
    if "ensemble" in parts:
        want = class_ensemble(torch.softmax(mask_logits(xt, mask) if "experts" in parts else xt, -1), mask)
    torch.testing.assert_close(ensemble_probs(xt, mask, hp.class_masks), want)


@pytest.mark.parametrize("parts", [("experts",), ("ensemble",), PARTS], ids=str)
def test_the_algorithm_predicts_with_the_parts_that_are_on(parts):
    """What the hosts evaluate and record: the experts are masked with part ``experts`` only, and
    the per-class ensemble (``ensemble_mask``, given to the evaluation and the records) is used
    with part ``ensemble`` only."""
    from dael_plugin.core.algorithm import DAEL
    from dael_plugin.core.heads import ExpertHeads

    torch.manual_seed(0)
    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    algo = DAEL(torch.nn.Identity(), ExpertHeads(4, 3, 2), DAELHparams(class_masks=parts), class_mask=mask)
    x = torch.randn(5, 4)
    with torch.no_grad():
        experts = algo.predict_experts(x)
        raw = torch.softmax(algo.heads(x), -1)
        assert ((experts[:, ~mask] == 0).all()) == ("experts" in parts)
        torch.testing.assert_close(
            experts, torch.softmax(mask_logits(algo.heads(x), mask), -1) if "experts" in parts else raw
        )
        assert (algo.ensemble_mask is mask) == ("ensemble" in parts)
        want = class_ensemble(experts, mask) if "ensemble" in parts else experts.mean(1)
        torch.testing.assert_close(algo.predict(x), want)
    assert DAEL(torch.nn.Identity(), ExpertHeads(4, 3, 2), DAELHparams(), class_mask=mask).class_mask is None
    with pytest.raises(ValueError, match="needs the"):
        DAEL(torch.nn.Identity(), ExpertHeads(4, 3, 2), DAELHparams(class_masks=parts))


def test_part_other_by_hand():
    """Expert 0 knows {0, 1}, expert 1 knows {1, 2}. An image of domain 0, class 0: expert 1 lacks
    class 0, so it should answer "not mine", -log p_1(0). An image of domain 1, class 2: -log p_0(2).
    An image of class 1: both know it, no pair. The mean over the two pairs."""
    from dael_plugin.core.category_shift import other_loss

    mask = torch.tensor([[T, T, F_], [F_, T, T]])
    probs = torch.tensor(
        [[[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]], [[0.1, 0.1, 0.8], [0.05, 0.15, 0.8]], [[0.2, 0.6, 0.2], [0.1, 0.8, 0.1]]]
    )
    labels = torch.tensor([0, 2, 1])
    want = -(math.log(0.3) + math.log(0.8)) / 2
    assert other_loss(probs.log(), labels, mask).item() == pytest.approx(want, rel=1e-6)
    # Expert 0 knows {0} alone: its "not mine" is its mass on {1, 2} together. Images of classes 2, 2
    # and 1 (all domain 1's): one pair each, with expert 0.
    three = torch.tensor([[T, F_, F_], [F_, T, T]])
    want = -(math.log(0.2 + 0.1) + math.log(0.1 + 0.8) + math.log(0.6 + 0.2)) / 3
    assert other_loss(probs.log(), torch.tensor([2, 2, 1]), three).item() == pytest.approx(want, rel=1e-6)
    assert other_loss(probs.log(), labels, torch.ones(2, 3, dtype=torch.bool)).item() == 0.0


def test_part_other_adds_its_term_and_nothing_else():
    """``CLASS_MASKS other``: the loss gains ``loss_other`` (on the target view's log-probabilities,
    unmasked), the other terms are the paper's; with every class everywhere it adds 0; it cannot
    be listed with ``experts``, which would mask the mass it trains."""
    from dael_plugin.core.category_shift import other_loss

    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    xt, xp, _, idx, ut, up = _batch(5)
    y = torch.tensor([0, 1, 2, 0] + [1, 2, 3, 3] + [0, 3, 4, 4])
    paper = dael_losses(xt, xp, y, idx, DAELHparams(), ut, up)
    out = dael_losses(xt, xp, y, idx, DAELHparams(class_masks=("other",)), ut, up, class_mask=mask)
    torch.testing.assert_close(out["loss_other"], other_loss(torch.log_softmax(xt, -1), y, mask))
    assert out["loss_other"].item() > 0
    for key in ("loss_x", "loss_cr", "loss_u"):
        torch.testing.assert_close(out[key], paper[key])
    torch.testing.assert_close(out["loss"], paper["loss"] + out["loss_other"])
    weighted = dael_losses(xt, xp, y, idx, DAELHparams(class_masks=("other",), weight_other=0.25), ut, up, mask)
    torch.testing.assert_close(weighted["loss_other"], out["loss_other"])
    torch.testing.assert_close(weighted["loss"], paper["loss"] + 0.25 * out["loss_other"])
    full = dael_losses(xt, xp, y, idx, DAELHparams(class_masks=("other",)), ut, up, torch.ones(3, 5, dtype=torch.bool))
    assert full["loss_other"].item() == 0.0
    torch.testing.assert_close(full["loss"], paper["loss"])
    with pytest.raises(ValueError, match="list one of the two"):
        DAELHparams(class_masks=("experts", "other"))
    assert "other" not in DAELHparams(class_masks=("all",)).class_masks


def test_class_masks_values():
    """``all`` is the four parts; an unknown or repeated part, and the parts a setting cannot
    have (a shared classifier has no per-domain expert; 'cr' compares with the others' mean),
    are one line each; the parts come out in one order."""
    assert DAELHparams(class_masks=("all",)).class_masks == PARTS
    assert DAELHparams(class_masks=["cr", "experts"]).class_masks == ("experts", "cr")
    assert DAELHparams(class_masks=("experts",), cr_mode="individual").masks("experts")
    for bad, said in [
        (dict(class_masks=("expert",)), "must list parts"),
        (dict(class_masks=("cr", "cr")), "must list parts"),
        (dict(class_masks=("all", "cr")), "'all' stands alone"),
        (dict(class_masks=(True,)), "must list parts"),
        (dict(class_masks=("ensemble",), classifier="single"), "CLASSIFIER experts"),
        (dict(class_masks=("cr",), cr_mode="individual"), "CR_MODE collaborative"),
        (dict(class_masks=("other",), weight_other=-1.0), "WEIGHT_OTHER must be a number from 0 to 10000"),
        (dict(class_masks=("all",), weight_other=0.5), "part 'other', which is off"),
    ]:
        with pytest.raises(ValueError, match=said):
            DAELHparams(**bad)


def test_class_masks_on_the_command_line_and_in_old_checkpoints(tmp_path):
    """``TRAINER.DAEL.CLASS_MASKS all`` (a bare word for a list key) is ``['all']``; a checkpoint
    written while the key was one bool resumes under the same setting, and only that."""
    from test_gpu_stand_ins import CFG, ROOT

    from dael_plugin.engine.checkpoint import config_diff
    from dael_plugin.tools.train import build_parser, setup_cfg

    def cfg(*opts):
        argv = ["--engine", "builtin", "--trainer", "DAEL", "--root", str(tmp_path), "--config-file", CFG]
        argv += ["--dataset-config-file", f"{ROOT}/configs/datasets/da/embedded_digits_cs.yaml", "--seed", "1", *opts]
        return setup_cfg(build_parser().parse_args(argv), "builtin")

    every = cfg("TRAINER.DAEL.CLASS_MASKS", "all", "SELECTION.KEEP_BEST", "im,oracle")
    assert list(every.TRAINER.DAEL.CLASS_MASKS) == ["all"] and list(every.SELECTION.KEEP_BEST) == ["im", "oracle"]
    two = cfg("TRAINER.DAEL.CLASS_MASKS", "cr,experts")
    assert list(two.TRAINER.DAEL.CLASS_MASKS) == ["cr", "experts"]
    for cur, old, same in [(every, True, True), (cfg(), False, True), (every, False, False), (two, True, False)]:
        saved = cur.clone()
        saved.defrost()
        saved.TRAINER.DAEL.CLASS_MASKS = old  # (a CfgNode takes any value set by hand)
        diff = [d for d in config_diff(saved.dump(), cur) if d[0] == "TRAINER.DAEL.CLASS_MASKS"]
        assert (diff == []) == same, (old, list(cur.TRAINER.DAEL.CLASS_MASKS), diff)
    explicit = cfg("TRAINER.DAEL.CLASS_MASKS", "pseudo_label,cr,ensemble,experts")
    assert config_diff(cfg("TRAINER.DAEL.CLASS_MASKS", "all").dump(), explicit) == []


# -- the data and the engines ------------------------------------------------------------------
ENGINES = ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)]
HELD = {"hand": "012345", "street": "34567", "font": "06789"}  # tools/category_shift.py's split


def _cs_trainer(engine, root, out, *extra):
    from test_gpu_stand_ins import CFG, ROOT, _trainer

    from dael_plugin.tools.train import build_parser, setup_cfg

    argv = ["--engine", engine, "--trainer", "DAEL", "--root", root]
    argv += ["--dataset-config-file", f"{ROOT}/configs/datasets/da/embedded_digits_cs.yaml", "--config-file", CFG]
    argv += ["--source-domains", "hand", "street", "font", "--target-domains", "blend", "--output-dir", str(out)]
    argv += ["--seed", "1", "OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0", "SELECTION.EVAL_FREQ", "1"]
    argv += ["DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8", *extra]
    if engine == "dassl":
        pytest.importorskip("dassl")
    return _trainer(engine, setup_cfg(build_parser().parse_args(argv), engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_category_shift_set_trains_on_each_engine_with_its_class_table(tmp_path, tiny_root, engine, capsys):
    """The embedded category-shift set (tools/category_shift.py) on a tiny copy: the union of the
    ten digits is the label space, each source's own digits are the mask, the masked experts give
    no probability to the digits their domain lacks, and one epoch trains and evaluates, records
    included, on both engines."""
    from dael_plugin.tools.category_shift import SOURCES, build_set

    assert SOURCES == HELD
    data = build_set(tiny_root)
    tr = _cs_trainer(engine, data, tmp_path / "masks", "TRAINER.DAEL.CLASS_MASKS", "all")
    said = capsys.readouterr().out
    assert "Category shift: hand: 6 of 10 classes, lacks 6, 7, 8, 9; street: 5 of 10" in said
    want = torch.tensor([[str(c) in HELD[d] for c in range(10)] for d in ("hand", "street", "font")])
    assert torch.equal(tr.algorithm.class_mask.cpu(), want)
    x = next(iter(tr.test_loader))["img"][:4].to(tr.device)
    with torch.no_grad():
        probs = tr.algorithm.predict_experts(x)
    assert (probs[:, ~want] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(4, 3))
    tr.train()
    rec = [line for line in open(tmp_path / "masks" / "epochs.jsonl")]
    assert len(rec) == 1
    naive = _cs_trainer(engine, data, tmp_path / "naive")
    assert naive.algorithm.class_mask is None and naive.num_classes == 10


@pytest.mark.parametrize("engine", ENGINES)
def test_agree_reads_the_class_table_without_class_masks(tmp_path, tiny_root, engine):
    """``PSEUDO_LABEL agree`` with ``CLASS_MASKS ()``: the trainer hands the class table over, so
    the rule asks only the experts that know a class (``corroborate`` needs part ``other``, so it
    always has the table). Heads set by hand: hand's expert is sure of 1 (hand's alone), street's
    of 4 (which hand knows too), font's of 6 (which street knows too). Only 1 is agreed, on every
    target image: mask_u 1 through the trainer's own step. Without the table every expert would
    have to be sure of one class, and nothing is kept (mask_u 0: L_u silently zero)."""
    from dael_plugin.tools.category_shift import build_set

    data = build_set(tiny_root)
    tr = _cs_trainer(engine, data, tmp_path / "agree", "TRAINER.DAEL.PSEUDO_LABEL", "agree")
    want = torch.tensor([[str(c) in HELD[d] for c in range(10)] for d in ("hand", "street", "font")])
    assert torch.equal(tr.algorithm.class_mask.cpu(), want)
    heads = tr.algorithm.heads
    with torch.no_grad():
        heads.weight.zero_()
        heads.bias.fill_(-10.0)
        for k, c in enumerate((1, 4, 6)):
            heads.bias[k, c] = 10.0
    batch_x = next(iter(tr.train_loader_x))
    batch_u = next(iter(tr.train_loader_u))
    out = tr.forward_backward(batch_x, batch_u)
    assert float(out["mask_u"]) == 1.0, out


def test_the_category_shift_set_is_built_once_when_asked_at_once(tmp_path, tiny_root, monkeypatch):
    """Two callers at once (two benchmarks on one --root, the suite's two workers): they wait for the
    kernel's lock, one builds, the other reads its copy. Without the lock both built into one
    temporary name and the second removed the first's finished set under its readers."""
    import shutil
    import threading
    import time

    import filelock

    from dael_plugin.data.embedded import DATASET_DIR
    from dael_plugin.tools import category_shift

    shutil.copytree(os.path.join(tiny_root, DATASET_DIR), tmp_path / DATASET_DIR)
    linked = []
    real = category_shift._link
    monkeypatch.setattr(category_shift, "_link", lambda src, dst: (linked.append(dst), real(src, dst)))
    made = []
    callers = [threading.Thread(target=lambda: made.append(category_shift.build_set(str(tmp_path)))) for _ in "ab"]
    with filelock.FileLock(str(tmp_path / ".embedded_digits_cs.lock")):
        for t in callers:
            t.start()
        time.sleep(0.5)
        assert not linked and sorted(os.listdir(tmp_path)) == [".embedded_digits_cs.lock", DATASET_DIR]  # both wait
    for t in callers:
        t.join(60)
    out = str(tmp_path / "embedded_digits_cs")
    assert made == [out, out]
    files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f != "VERSION"]
    assert sorted(linked) == sorted(p.replace(out, out + f".tmp.{os.getpid()}", 1) for p in files)  # built once


def test_a_root_that_cannot_take_the_category_shift_set_is_one_line(tmp_path, tiny_root, monkeypatch, capsys):
    """A full or read-only --root while the set is made: the benchmark says so in one line (exit 2),
    and leaves no half-made set to be read as whole."""
    import errno
    import shutil

    from dael_plugin.data.embedded import DATASET_DIR
    from dael_plugin.tools import category_shift

    shutil.copytree(os.path.join(tiny_root, DATASET_DIR), tmp_path / DATASET_DIR)

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

    monkeypatch.setattr(category_shift, "_link", full)
    argv = ["--root", str(tmp_path), "--output", str(tmp_path / "runs"), "--seeds", "1", "--only", "source_only"]
    assert category_shift.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not make the category-shift set"), err
    assert "No space left on device" in err[0] and "--root you can write to" in err[0]
    assert not os.path.exists(tmp_path / "embedded_digits_cs")


def test_without_the_key_such_data_is_refused_in_one_line_that_names_it(tmp_path, tiny_root):
    from dael_plugin.data.folders import load_splits
    from dael_plugin.errors import DAELConfigError
    from dael_plugin.tools.category_shift import build_set

    data = build_set(tiny_root)
    with pytest.raises(DAELConfigError, match="set DATASET.CATEGORY_SHIFT True to read the union"):
        load_splits("DomainFolders", data, ["hand", "street", "font"], ["blend"])
    splits = load_splits("DomainFolders", data, ["hand", "street", "font"], ["blend"], category_shift=True)
    assert splits["classnames"] == [str(c) for c in range(10)]
    # a digit only the target holds cannot be learned: one line
    with pytest.raises(DAELConfigError, match=r"class\(es\) \['1', '2'\] are in no source domain"):
        load_splits("DomainFolders", data, ["street", "font"], ["blend"], category_shift=True)


def test_the_class_table_by_hand():
    from collections import namedtuple

    from dael_plugin.data.classes import classes_by_domain, describe

    It = namedtuple("It", "domain label")
    held = classes_by_domain([It(0, 0), It(0, 2), It(1, 1), It(1, 2), It(1, 2)], 2, 3)
    assert held == [[True, False, True], [False, True, True]]
    assert describe(held, ["a", "b"], ["x", "y", "z"]) == ["a: 2 of 3 classes, lacks y", "b: 2 of 3 classes, lacks x"]


def test_the_benchmarks_pseudo_label_columns_read_both_engines_logs(tmp_path):
    from dael_plugin.tools.category_shift_table import last_pseudo_labels as _last_pseudo_labels

    builtin = "epoch [15/15] batches 19 loss_x 0.0205 acc_x 99.9% loss_cr 0.1644 loss_u 0.5314 mask_u 84.4% pl_acc_u 38.6% eta"
    dassl = (
        "epoch [15/15] batch [10/14] time 0.229 (0.352) loss_u 0.4205 (0.4621) mask_u 78.1% (81.2%) "
        "pl_acc_u 24.0% (39.6%) lr 5.4631e-04"
    )
    for name, line, want in (
        ("b", builtin, (84.4, 38.6)),
        ("d", dassl, (81.2, 39.6)),
        ("bo", builtin.replace("pl_acc_u", "loss_other 0.3451 pl_acc_u"), (84.4, 38.6)),  # part 'other'
        ("do", dassl.replace("pl_acc_u", "loss_other 0.2384 (0.4771) pl_acc_u"), (81.2, 39.6)),
        ("n", "epoch [1/1] loss 2", None),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log.txt").write_text(
            "epoch [1/15] batches 19 mask_u 1.0% pl_acc_u 2.0%\n" * (name != "n") + line
        )
        assert _last_pseudo_labels({"output_dir": str(tmp_path / name)}) == want
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "log.txt").write_text("epoch [15/15] batches 19 loss_u 0.0000 mask_u 0.0% pl_acc_u - eta 0:00:00")
    kept, right = _last_pseudo_labels({"output_dir": str(tmp_path / "z")})
    assert kept == 0.0 and right != right  # NaN: no pseudo-label kept


def test_the_benchmark_reuses_a_run_only_under_the_settings_it_was_launched_with(tmp_path, monkeypatch):
    """scripts/category_shift.py reused any folder holding a results.json: ``--epochs 5`` after 15,
    or ``--engine dassl`` into the folder of a built-in run, printed the old run's accuracy as the
    new row's. Now each folder keeps its settings: the same settings reuse the record without a
    process; others, or a hostile settings file, are one line; a folder from before the settings
    were kept goes through train.py's own check. (train.py is replaced by a stand-in here.)"""
    import argparse
    import json
    import os

    from dael_plugin.tools import category_shift as cs

    launched = []

    def fake_run(cmd, stdout=None):
        out = cmd[cmd.index("--output-dir") + 1]
        launched.append((out, stdout))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"accuracy": 50.0, "epochs": int(cmd[cmd.index("OPTIM.MAX_EPOCH") + 1])}, f)
        return argparse.Namespace(returncode=0)

    monkeypatch.setattr(cs.subprocess, "run", fake_run)
    args = argparse.Namespace(output=str(tmp_path), engine="builtin", epochs=15, quiet=True, split=1, records=0)
    method = "DAEL (CLASS_MASKS)"
    assert cs._run(args, method, 1, "data")["accuracy"] == 50.0 and len(launched) == 1
    folder = tmp_path / "dael_masks_seed1"
    assert json.loads((folder / cs.IDENTITY).read_text()) == cs.identity(args, method, 1)
    assert cs._run(args, method, 1, "data")["epochs"] == 15 and len(launched) == 1  # reused, no process
    for change, said in [
        (dict(epochs=5), "epochs: 15 -> 5"),
        (dict(engine="dassl"), "engine: builtin -> dassl"),
    ]:
        with pytest.raises(SystemExit, match=said):
            cs._run(argparse.Namespace(**{**vars(args), **change}), method, 1, "data")
    assert len(launched) == 1
    (folder / cs.IDENTITY).unlink()
    os.mkfifo(folder / cs.IDENTITY)  # would block a plain open() until a writer came
    with pytest.raises(SystemExit, match="its category_shift_run.json is not a regular file"):
        cs._run(args, method, 1, "data")
    (folder / cs.IDENTITY).unlink()  # a folder written before the settings were kept
    assert cs._run(args, method, 1, "data")["accuracy"] == 50.0
    assert launched[-1] == (str(folder), cs.subprocess.DEVNULL) and len(launched) == 2  # train.py checked it
    assert json.loads((folder / cs.IDENTITY).read_text()) == cs.identity(args, method, 1)
    assert cs.output_folder(argparse.Namespace(output=None, engine="dassl", split=1)).endswith("category_shift/dassl")
    two = cs.output_folder(argparse.Namespace(output=None, engine="builtin", split=2))
    assert two.endswith("category_shift/split2/builtin")  # the splits' runs never share a folder
    with pytest.raises(SystemExit, match="sources: "):  # nor does a folder of the other split lend its run
        cs._run(argparse.Namespace(**{**vars(args), "split": 2}), method, 1, "data")
    records = argparse.Namespace(**{**vars(args), "records": 3})
    with pytest.raises(SystemExit, match="options: "):  # with records the held-out part trains less: another run
        cs._run(records, method, 1, "data")


@pytest.mark.parametrize("case", ["epochs 0", "seeds twice", "output is a file", "old embedded set"])
def test_the_benchmarks_bad_arguments_are_one_line_before_any_run(tmp_path, capsys, monkeypatch, case):
    """--epochs 0 (its finished runs would hold the folder for good), --seeds 1 1 (one run weighed
    twice), --output a file, and an embedded set of another version: one line each, no run started."""
    from dael_plugin.data.embedded import DATASET_DIR
    from dael_plugin.tools import category_shift as bench

    monkeypatch.setattr(bench, "_run", lambda *a, **k: pytest.fail("a run was started"))
    root, out = tmp_path / "data", tmp_path / "out"
    argv = ["--root", str(root), "--output", str(out), "--seeds", "1", "2", "--epochs", "3"]
    said = {
        "epochs 0": "--epochs 0: give at least 1",
        "seeds twice": "--seeds lists seed(s) [1] more than once",
        "output is a file": "exists and is not a folder",
        "old embedded set": "exists but is not the embedded set this version makes",
    }[case]
    if case == "epochs 0":
        argv[argv.index("--epochs") + 1] = "0"
    elif case == "seeds twice":
        argv[argv.index("2")] = "1"
    elif case == "output is a file":
        out.write_text("x")
    else:
        (root / DATASET_DIR).mkdir(parents=True)
        (root / DATASET_DIR / "VERSION").write_text("1 seed=0")
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err


@pytest.mark.dassl
def test_dassls_own_source_only_says_its_class_table_too(tmp_path, tiny_root, capsys):
    """Under DATASET.CATEGORY_SHIFT the Dassl engine's SourceOnly (Dassl's own trainer) printed no
    "Category shift: ... lacks" line, where the plugin's trainers do."""
    pytest.importorskip("dassl")
    from test_gpu_stand_ins import ROOT

    from dael_plugin.tools.category_shift import build_set
    from test_hardening import cli

    data = build_set(tiny_root)
    argv = ["--engine", "dassl", "--trainer", "SourceOnly", "--root", data]
    argv += ["--dataset-config-file", f"{ROOT}/configs/datasets/da/embedded_digits_cs.yaml"]
    argv += ["--config-file", f"{ROOT}/configs/trainers/da/source_only/embedded_digits.yaml"]
    argv += ["--source-domains", "hand", "street", "font", "--target-domains", "blend"]
    argv += ["--output-dir", str(tmp_path / "so"), "OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0"]
    code, out, err = cli(argv, capsys)
    assert code == 0, err[-2000:]
    assert "Category shift: hand: 6 of 10 classes, lacks 6, 7, 8, 9; street: 5 of 10" in out


# The pseudo-labelling rules of issue 38 (docs/category_shift.md, "Pseudo-labelling rules").
MASK3 = torch.tensor([[T, T, F_], [F_, T, T]])  # expert 0 knows classes 0 1, expert 1 knows 1 2


def test_agree_keeps_the_class_every_expert_that_knows_it_is_confident_of():
    """Three target images, two experts. (a) expert 0 says 0 (which it alone knows) at 0.97 and
    expert 1 says 2 (which it alone knows) at 0.98: two classes claimed, the image is dropped, where
    the most confident expert would keep 2. (b) expert 0 says 0 at 0.96; expert 1 says 1 at 0.96, but
    expert 0 also knows 1 and gives it 0.04: 1 is not agreed, 0 is kept (the most confident expert
    would break the tie for either). (c) both say 1, which both know: kept at the lesser, 0.97."""
    p = torch.tensor(
        [
            [[0.97, 0.03, 0.00], [0.00, 0.02, 0.98]],
            [[0.96, 0.04, 0.00], [0.00, 0.96, 0.04]],
            [[0.01, 0.99, 0.00], [0.00, 0.97, 0.03]],
        ]
    )
    labels, keep, score = agreed_labels(p, MASK3, 0.95)
    assert labels.tolist()[1:] == [0, 1] and keep.tolist() == [0.0, 1.0, 1.0]
    assert score.tolist() == pytest.approx([0.98, 0.96, 0.97])
    most_confident, kept, _ = pseudo_labels(p, 0.95, "expert", own_classes=MASK3)
    assert most_confident.tolist()[0] == 2 and kept.tolist()[0] == 1.0  # the rule that (a) tells apart
    assert (pseudo_labels(p, 0.95, "agree", own_classes=MASK3)[1] == keep).all()
    # without a mask every expert knows every class: the label all of them give, at the least confidence
    labels, keep, score = agreed_labels(p, None, 0.5)
    assert keep.tolist() == [0.0, 0.0, 1.0] and labels[2].item() == 1 and score[2].item() == pytest.approx(0.97)


def test_corroborate_also_asks_the_experts_that_lack_the_class_to_say_not_mine():
    """Expert 0 gives class 0 (which expert 1 lacks) 0.97. Expert 1's mass on the class it lacks
    (its "not mine", class 0) is 0.96 in the first image and 0.30 in the second: corroborated in the
    first, dropped in the second, where ``agree`` keeps both (expert 0 alone knows class 0)."""
    p = torch.tensor(
        [
            [[0.97, 0.02, 0.01], [0.96, 0.03, 0.01]],
            [[0.97, 0.02, 0.01], [0.30, 0.60, 0.10]],
        ]
    )
    labels, keep, score = agreed_labels(p, MASK3, 0.95, not_mine=True)
    assert labels[0].item() == 0 and keep.tolist() == [1.0, 0.0]
    assert score.tolist() == pytest.approx([0.96, 0.30])
    assert agreed_labels(p, MASK3, 0.95)[1].tolist() == [1.0, 1.0]


def test_agree_in_fp16_itself():
    """Run in fp16 directly (not converted after): the same labels, and no NaN or inf score."""
    p = torch.softmax(torch.randn(64, 3, 5, generator=torch.Generator().manual_seed(0)) * 6, -1)
    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    for not_mine in (False, True):
        l32, k32, s32 = agreed_labels(p, mask, 0.6, not_mine)
        l16, k16, s16 = agreed_labels(p.half(), mask, 0.6, not_mine)
        assert s16.dtype == torch.float16 and torch.isfinite(s16).all()
        close = (s32 - 0.6).abs() > 1e-2  # away from the threshold, fp16 rounding decides nothing
        assert (k16[close] == k32[close].half()).all() and (l16[k32 > 0] == l32[k32 > 0]).all()


def test_the_class_balanced_l_u_by_hand():
    """Four kept images, three of pseudo-class 0 (losses 1, 2, 3) and one of class 1 (loss 4): the
    per-class means 2 and 4 weigh alike, 3.0, where Eq. 3's mean is 2.5. With the third image dropped:
    (1.5 + 4) / 2 times the 3 of 4 kept, 2.0625 (Eq. 3: 7 / 4 = 1.75). Classes kept equally often: Eq. 3."""
    ce = torch.tensor([1.0, 2.0, 3.0, 4.0])
    labels = torch.tensor([0, 0, 0, 1])
    assert balanced_u_loss(ce, labels, torch.ones(4), 3).item() == pytest.approx(3.0)
    assert balanced_u_loss(ce, labels, torch.tensor([1.0, 1.0, 0.0, 1.0]), 3).item() == pytest.approx(2.0625)
    assert balanced_u_loss(ce, labels, torch.zeros(4), 3).item() == 0.0
    even = torch.tensor([0, 1, 0, 1])
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert balanced_u_loss(ce, even, mask, 3).item() == pytest.approx((ce * mask).mean().item())
    half = balanced_u_loss(ce.half(), labels, torch.ones(4).half(), 3)  # fp16 itself
    assert half.dtype == torch.float16 and half.item() == pytest.approx(3.0)


def test_the_rules_reach_dael_losses_and_nothing_else():
    """With ``PSEUDO_LABEL agree`` / ``corroborate`` and ``U_BALANCE`` the step's pseudo-labels are
    the rule's and L_u the balanced one; L_ce, L_cr and the "not mine" term are today's, bit for bit."""
    x_t, x_p, y, d, u_t, u_p = _batch(3, m=12)  # 12 target images, kept classes of unequal counts
    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    for parts, rule in (
        (("experts", "ensemble", "cr"), "agree"),
        (("other", "ensemble", "pseudo_label"), "corroborate"),
    ):
        base = dael_losses(x_t, x_p, y, d, DAELHparams(class_masks=parts, conf_thre=0.5), u_t, u_p, mask)
        hp = DAELHparams(class_masks=parts, conf_thre=0.5, pseudo_label=rule, u_balance=True)
        out = dael_losses(x_t, x_p, y, d, hp, u_t, u_p, mask)
        for key in ("loss_x", "loss_cr") + (("loss_other",) if "other" in parts else ()):
            assert torch.equal(out[key], base[key]), key
        logits = u_t if "other" in parts else mask_logits(u_t, mask)
        labels, keep, _ = agreed_labels(torch.softmax(logits, -1), mask, 0.5, not_mine=rule == "corroborate")
        assert torch.equal(out["pseudo_label_u"], labels) and torch.equal(out["pseudo_mask_u"], keep)
        assert 0 < keep.sum() < len(keep)  # the case tells kept from dropped
        logp = torch.log_softmax(u_p if "other" in parts else mask_logits(u_p, mask), -1)
        ens = class_ensemble(logp.exp(), mask).clamp_min(1e-12).log()
        ce = torch.nn.functional.nll_loss(ens, labels, reduction="none")
        assert out["loss_u"].item() == pytest.approx(balanced_u_loss(ce, labels, keep, 5).item(), rel=1e-6)
        assert out["loss_u"].item() != pytest.approx((ce * keep).mean().item(), rel=1e-3)  # not Eq. 3's


def test_the_rules_keys_and_their_one_line_refusals():
    with pytest.raises(ValueError, match="PSEUDO_LABEL corroborate asks the experts that lack a class"):
        DAELHparams(class_masks=("all",), pseudo_label="corroborate")
    with pytest.raises(ValueError, match="U_BALANCE must be True or False"):
        DAELHparams(u_balance="yes")
    from dael_plugin.config import hparams_from_cfg
    from dael_plugin.config.defaults import get_builtin_cfg

    cfg = get_builtin_cfg()
    assert cfg.TRAINER.DAEL.U_BALANCE is False and cfg.TRAINER.DAEL.PSEUDO_LABEL == "expert"
    cfg.merge_from_list(
        ["TRAINER.NAME", "DAEL", "TRAINER.DAEL.PSEUDO_LABEL", "agree", "TRAINER.DAEL.U_BALANCE", "True"]
    )
    hp = hparams_from_cfg(cfg)
    assert (hp.pseudo_label, hp.u_balance) == ("agree", True)


@pytest.mark.parametrize("rule", ["agree", "corroborate"])
def test_the_rules_are_one_graph_without_a_host_read(rule):
    """``fullgraph=True`` makes any read of a value back to the host (``.item()``, a ``bincount``'s
    size, a data-dependent shape) a graph break and so an error. ``backend="eager"`` traces with
    dynamo alone: the check costs no compilation. It cannot see a kernel's own synchronisation."""
    x_t, x_p, y, d, u_t, u_p = _batch(3, m=12)
    mask = torch.tensor([[T, T, T, F_, F_], [F_, T, T, T, F_], [T, F_, F_, T, T]])
    parts = ("other", "ensemble", "pseudo_label") if rule == "corroborate" else ("all",)
    hp = DAELHparams(class_masks=parts, conf_thre=0.5, pseudo_label=rule, u_balance=True)
    torch._dynamo.reset()
    traced = torch.compile(dael_losses, fullgraph=True, backend="eager")
    out = traced(x_t, x_p, y, d, hp, u_t, u_p, mask)
    ref = dael_losses(x_t, x_p, y, d, hp, u_t, u_p, mask)
    assert torch.equal(out["pseudo_mask_u"], ref["pseudo_mask_u"]) and torch.allclose(out["loss"], ref["loss"])


def test_the_benchmark_runs_both_splits_from_one_command(tmp_path, monkeypatch, capsys):
    """``--split 1 2``: each split's runs in a folder of their own, on that split's sources, and a
    table each naming the digits one source alone holds (split 2: 1 2 4 5 6 8 9)."""
    from dael_plugin.tools import category_shift as bench

    calls = []

    def fake_run(args, method, seed, data):
        out = tmp_path / f"run{len(calls)}"
        out.mkdir()
        (out / "log.txt").write_text("")
        calls.append((args.split, args.output, data))
        return {"accuracy": 50.0, "output_dir": str(out), "per_class_accuracy": {str(d): 10.0 for d in range(10)}}

    monkeypatch.setattr(bench, "_run", fake_run)
    monkeypatch.setattr(bench, "build_set", lambda root, split: f"set{split}")
    argv = ["--split", "1", "2", "--output", str(tmp_path / "o"), "--seeds", "1", "--only", "source_only"]
    assert bench.main(argv) == 0
    assert calls == [(1, str(tmp_path / "o" / "split1"), "set1"), (2, str(tmp_path / "o" / "split2"), "set2")]
    out = capsys.readouterr().out
    assert "split 2, sources hand: 0 1 2 3; street: 3 4 5 6 7; font: 0 7 8 9" in out
    assert "1 2 4 5 6 8 9 (one source each)" in out and "1 2 8 9 (one source each)" in out
    assert bench.single_source_digits(bench.SPLITS[1]) == ["1", "2", "8", "9"]


def test_the_benchmarks_choice_among_rules_reads_source_validation_not_the_target(tmp_path):
    """Two rules' runs, one seed: rule ``a`` scores best on source validation at its epoch 1, rule ``b``
    on the target (the oracle's field). ``source_val`` must choose ``a``, epoch 1, and report that
    epoch's target test accuracy; the oracle chooses ``b``'s last epoch. A choice that read the target
    test accuracy would pick ``b``'s epoch 1 (90)."""
    import json

    from dael_plugin.tools.category_shift_table import chosen_text, rule_choice

    def run(name, epochs):
        out = tmp_path / name
        out.mkdir()
        lines = [
            {"epoch": e, "source_val_accuracy": sv, "target_val_accuracy": tv, "target_test_accuracy": tt}
            for e, (sv, tv, tt) in enumerate(epochs, 1)
        ]
        (out / "epochs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return {"output_dir": str(out), "accuracy": epochs[-1][2], "epochs": len(epochs), "seed": 1}

    a = run("a", [(80.0, 30.0, 40.0), (70.0, 35.0, 45.0)])
    b = run("b", [(60.0, 50.0, 90.0), (65.0, 60.0, 55.0)])
    text = rule_choice({"a": [a], "b": [b]}, [1], "source_val")
    assert "seed 1: a epoch 1 (40.00)" in text and "40.00 ± 0.00" in text
    oracle = rule_choice({"a": [a], "b": [b]}, [1], "oracle")
    assert "seed 1: b epoch 2 (55.00)" in oracle and "upper bound" in oracle
    assert chosen_text([a, b], "source_val") == " 47.50 ± 10.61"  # each run its own epoch: 40 and 55


def test_a_one_class_source_is_warned_of():
    from dael_plugin.data.classes import one_class_warning

    held = [[True, True, False], [False, False, True]]
    said = one_class_warning(held, ["a", "b"], ["x", "y", "z"])
    assert said.startswith("Warning: source b holds one class (z)") and "\n" not in said
    assert one_class_warning([[True, True, False], [False, True, True]], ["a", "b"], ["x", "y", "z"]) == ""


def test_u_balance_without_l_u_is_refused():
    from dael_plugin.core import DAELHparams

    with pytest.raises(ValueError, match="U_BALANCE True balances L_u, which LOSSES ce_cr leaves out"):
        DAELHparams(losses="ce_cr", u_balance=True)
