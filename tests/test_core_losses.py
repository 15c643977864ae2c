"""DAEL losses against hand-worked numbers (paper Eq. 1-4), gradients and switches."""

import math

import pytest
import torch

from dael_plugin.core import (
    DAEL,
    DAELHparams,
    ExpertHeads,
    consistency_loss,
    dael_losses,
    pseudo_labels,
)


def logits_of(probs):
    """Logits whose softmax is exactly ``probs``."""
    return torch.tensor(probs, dtype=torch.float64).log()


# Two source domains, two classes. Sample 0 is from domain 0 (label 0), sample 1
# from domain 1 (label 1). Probabilities per [sample][expert].
WEAK = [[[0.8, 0.2], [0.6, 0.4]], [[0.3, 0.7], [0.1, 0.9]]]
STRONG = [[[0.7, 0.3], [0.5, 0.5]], [[0.4, 0.6], [0.2, 0.8]]]
# Target: u0 has a 0.96-confident expert 0 (kept, label 0); u1 tops out at 0.8 (masked).
U_WEAK = [[[0.96, 0.04], [0.3, 0.7]], [[0.6, 0.4], [0.2, 0.8]]]
U_STRONG = [[[0.5, 0.5], [0.7, 0.3]], [[0.9, 0.1], [0.9, 0.1]]]
LABELS = torch.tensor([0, 1])
EXPERT = torch.tensor([0, 1])

# Worked by hand:
L_CE = -(math.log(0.8) + math.log(0.9)) / 2  # each expert on its own domain, weak view
# sample 0: expert 0 weak [0.8,0.2] vs non-expert 1 strong [0.5,0.5] -> 0.09 + 0.09
# sample 1: expert 1 weak [0.1,0.9] vs non-expert 0 strong [0.4,0.6] -> 0.09 + 0.09
L_CR = 0.18
# u0: ensemble strong mean [0.6, 0.4], pseudo-label 0 -> -log 0.6; u1 masked -> 0; batch mean
L_U = -math.log(0.6) / 2


def run(hp=DAELHparams(), u=True):
    return dael_losses(
        logits_of(WEAK),
        logits_of(STRONG),
        LABELS,
        EXPERT,
        hp,
        logits_of(U_WEAK) if u else None,
        logits_of(U_STRONG) if u else None,
    )


def test_hand_worked_example():
    out = run()
    assert out["loss_x"].item() == pytest.approx(L_CE, abs=1e-12)
    assert out["loss_cr"].item() == pytest.approx(L_CR, abs=1e-12)
    assert out["loss_u"].item() == pytest.approx(L_U, abs=1e-12)
    assert out["mask_u"].item() == pytest.approx(0.5)
    assert out["loss"].item() == pytest.approx(L_CE + L_CR + 0.5 * L_U, abs=1e-12)
    assert out["acc_x"].item() == pytest.approx(100.0)


def test_dg_has_no_unsupervised_term():
    out = run(u=False)
    assert out["loss_u"].item() == 0.0
    assert out["loss"].item() == pytest.approx(L_CE + L_CR, abs=1e-12)


def test_weight_u_scales_only_lu():
    out = run(DAELHparams(weight_u=2.0))
    assert out["loss"].item() == pytest.approx(L_CE + L_CR + 2.0 * L_U, abs=1e-12)


def test_confidence_threshold_is_inclusive_and_masks():
    probs = torch.tensor([[[0.95, 0.05]], [[0.9499, 0.0501]]], dtype=torch.float64)
    labels, mask, conf = pseudo_labels(probs, 0.95)
    assert mask.tolist() == [1.0, 0.0]
    assert labels.tolist() == [0, 0]
    # With a threshold of 0.97, u0 (0.96) is masked too and L_u is zero.
    out = run(DAELHparams(conf_thre=0.97))
    assert out["loss_u"].item() == 0.0 and out["mask_u"].item() == 0.0


def test_pseudo_label_from_most_confident_expert_not_ensemble():
    # Expert 0 says class 0 with 0.96, expert 1 says class 1 with 0.97: expert 1 wins.
    probs = torch.tensor([[[0.96, 0.04], [0.03, 0.97]]])
    labels, mask, conf = pseudo_labels(probs, 0.95, "expert")
    assert labels.item() == 1 and mask.item() == 1.0 and conf.item() == pytest.approx(0.97)
    # The ensemble is [0.495, 0.505]: below the threshold.
    labels, mask, conf = pseudo_labels(probs, 0.95, "ensemble")
    assert labels.item() == 1 and mask.item() == 0.0 and conf.item() == pytest.approx(0.505)


def test_switch_cr_target_label():
    out = run(DAELHparams(cr_target="label"))
    # sample 0: [1,0] vs [0.5,0.5] -> 0.5; sample 1: [0,1] vs [0.4,0.6] -> 0.32
    assert out["loss_cr"].item() == pytest.approx((0.5 + 0.32) / 2, abs=1e-12)


def test_switch_collaborative_vs_individual_with_three_experts():
    target = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    strong = logits_of([[[0.5, 0.5], [0.6, 0.4], [0.8, 0.2]]]).log_softmax(-1)
    expert = torch.tensor([0])
    col = consistency_loss(target, strong, expert, "collaborative", "mse")
    ind = consistency_loss(target, strong, expert, "individual", "mse")
    assert col.item() == pytest.approx(0.18, abs=1e-12)  # mean [0.7,0.3]: 0.09 + 0.09
    assert ind.item() == pytest.approx((0.32 + 0.08) / 2, abs=1e-12)
    kl = consistency_loss(target, strong, expert, "collaborative", "kl")
    assert kl.item() == pytest.approx(-math.log(0.7), abs=1e-12)


def test_switch_kl_on_hand_example():
    out = run(DAELHparams(cr_loss="kl"))
    kl0 = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    kl1 = 0.1 * math.log(0.1 / 0.4) + 0.9 * math.log(0.9 / 0.6)
    assert out["loss_cr"].item() == pytest.approx((kl0 + kl1) / 2, abs=1e-12)


def test_switch_losses_ablation():
    assert run(DAELHparams(losses="ce"))["loss"].item() == pytest.approx(L_CE, abs=1e-12)
    out = run(DAELHparams(losses="ce_cr"))
    assert out["loss_u"].item() == 0.0
    assert out["loss"].item() == pytest.approx(L_CE + L_CR, abs=1e-12)


def test_switch_ensemble_pseudo_label_on_hand_example():
    # Ensemble of u0's weak view: [0.63, 0.37] < 0.95, so nothing is kept.
    out = run(DAELHparams(pseudo_label="ensemble"))
    assert out["loss_u"].item() == 0.0 and out["mask_u"].item() == 0.0
    # At 0.62 the ensemble keeps u0 (0.63, class 0) and drops u1 (its ensemble [0.4, 0.6]); the most
    # confident expert keeps both (0.96 and 0.8). Strong ensembles: u0 [0.6, 0.4], u1 [0.9, 0.1].
    out = run(DAELHparams(pseudo_label="ensemble", conf_thre=0.62))
    assert out["mask_u"].item() == pytest.approx(0.5)
    assert out["loss_u"].item() == pytest.approx(-math.log(0.6) / 2, abs=1e-12)
    out = run(DAELHparams(pseudo_label="expert", conf_thre=0.62))
    assert out["mask_u"].item() == pytest.approx(1.0)
    assert out["loss_u"].item() == pytest.approx((-math.log(0.6) - math.log(0.1)) / 2, abs=1e-12)


def test_single_classifier_is_its_own_ensemble():
    weak = logits_of([[[0.8, 0.2]], [[0.1, 0.9]]])
    strong = logits_of([[[0.5, 0.5]], [[0.4, 0.6]]])
    out = dael_losses(weak, strong, LABELS, torch.zeros(2, dtype=torch.long), DAELHparams(classifier="single"))
    assert out["loss_cr"].item() == pytest.approx(0.18, abs=1e-12)


def test_invalid_switch_values_are_rejected_clearly():
    with pytest.raises(ValueError, match="CR_MODE must be one of"):
        DAELHparams(cr_mode="both")
    with pytest.raises(ValueError, match="CONF_THRE"):
        DAELHparams(conf_thre=1.5)


def test_gradients_flow_only_through_prediction_path():
    weak = logits_of(WEAK).requires_grad_()
    strong = logits_of(STRONG).requires_grad_()
    u_weak = logits_of(U_WEAK).requires_grad_()
    u_strong = logits_of(U_STRONG).requires_grad_()
    out = dael_losses(weak, strong, LABELS, EXPERT, DAELHparams(), u_weak, u_strong)

    # L_cr: the expert's weak prediction is a target, so no gradient reaches it.
    (g_weak,) = torch.autograd.grad(out["loss_cr"], weak, retain_graph=True, allow_unused=True)
    assert g_weak is None or torch.all(g_weak == 0)
    g_strong = torch.autograd.grad(out["loss_cr"], strong, retain_graph=True)[0]
    # Only the non-experts' strong predictions move: (sample 0, expert 1), (sample 1, expert 0).
    assert torch.all(g_strong[0, 0] == 0) and torch.all(g_strong[1, 1] == 0)
    assert g_strong[0, 1].abs().sum() > 0 and g_strong[1, 0].abs().sum() > 0

    # L_ce: only each sample's own expert gets a gradient.
    g_ce = torch.autograd.grad(out["loss_x"], weak, retain_graph=True)[0]
    assert torch.all(g_ce[0, 1] == 0) and torch.all(g_ce[1, 0] == 0)
    assert g_ce[0, 0].abs().sum() > 0

    # L_u: pseudo-labels carry no gradient; the strong view of kept samples does.
    assert torch.autograd.grad(out["loss_u"], u_weak, retain_graph=True, allow_unused=True)[0] is None
    g_u = torch.autograd.grad(out["loss_u"], u_strong, retain_graph=True)[0]
    assert g_u[0].abs().sum() > 0 and torch.all(g_u[1] == 0)  # u1 is masked


@pytest.mark.parametrize("k", [2, 3, 5])
def test_expert_heads_shape_and_equal_to_separate_linears(k):
    torch.manual_seed(0)
    heads = ExpertHeads(7, 4, k)
    linears = [torch.nn.Linear(7, 4) for _ in range(k)]
    heads.load_from_linears(linears)
    x = torch.randn(6, 7)
    out = heads(x)
    assert out.shape == (6, k, 4)
    for i, lin in enumerate(linears):
        torch.testing.assert_close(out[:, i], lin(x))


def test_algorithm_views_and_backbone_call_order():
    """Backbone calls follow the reference order, one per domain chunk."""
    seen = []

    def featurizer(x):
        seen.append((round(float(x[0, 0]), 1), x.shape[0]))
        return x.flatten(1)

    heads = ExpertHeads(2, 3, 2)
    hp = DAELHparams()
    alg = DAEL(featurizer, heads, hp)
    x_weak = torch.full((4, 2), 1.0)
    x_strong = torch.full((4, 2), 2.0)
    u = [torch.full((3, 2), 3.0), torch.full((3, 2), 4.0)]
    out = alg.losses([x_weak, x_strong], torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), [2, 2], u)
    assert seen == [(3.0, 3), (1.0, 2), (1.0, 2), (2.0, 2), (2.0, 2), (4.0, 3)]
    assert torch.isfinite(out["loss"])

    seen.clear()
    alg = DAEL(featurizer, heads, DAELHparams(views="strong_weak"))
    alg.losses([x_weak, x_strong], torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), [2, 2], u)
    assert [v for v, _ in seen] == [4.0, 2.0, 2.0, 1.0, 1.0, 3.0]

    seen.clear()
    x_strong2 = torch.full((4, 2), 5.0)
    u3 = u + [torch.full((3, 2), 6.0)]
    alg = DAEL(featurizer, heads, DAELHparams(views="strong_strong"))
    alg.losses([x_weak, x_strong, x_strong2], torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), [2, 2], u3)
    assert [v for v, _ in seen] == [4.0, 2.0, 2.0, 5.0, 5.0, 6.0]


def test_ce_only_skips_strong_and_target_passes():
    calls = []

    def featurizer(x):
        calls.append(x.shape[0])
        return x

    alg = DAEL(featurizer, ExpertHeads(2, 3, 2), DAELHparams(losses="ce"))
    x = torch.randn(4, 2)
    alg.losses([x, x], torch.tensor([0, 1, 2, 0]), torch.tensor([0, 0, 1, 1]), [2, 2], [x, x])
    assert calls == [2, 2]


def test_prediction_is_mean_of_expert_probabilities():
    """Hand-worked, identity features, two classes.

    Expert 0 passes the features through as logits, expert 1 outputs zeros.
    For x = (log 3, 0): expert 0 gives (3/4, 1/4), expert 1 gives (1/2, 1/2),
    so the prediction is their mean, (5/8, 3/8). Averaging logits instead would
    give softmax((log 3)/2, 0) = (0.634, 0.366), which this test rejects.
    """
    heads = ExpertHeads(2, 2, 2).double()
    with torch.no_grad():
        heads.weight.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]], dtype=torch.float64))
        heads.bias.zero_()
    alg = DAEL(torch.nn.Identity(), heads, DAELHparams())
    x = torch.tensor([[math.log(3), 0.0], [0.0, math.log(4)]], dtype=torch.float64)
    # row 1: expert 0 gives (1/5, 4/5), expert 1 (1/2, 1/2) -> (7/20, 13/20)
    expected = torch.tensor([[5 / 8, 3 / 8], [7 / 20, 13 / 20]], dtype=torch.float64)
    torch.testing.assert_close(alg.predict(x), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(alg.predict_experts(x)[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]], dtype=torch.float64))


def test_consistency_averages_all_other_experts_when_a_batch_lacks_a_domain():
    """N_DOMAIN below the number of sources: three experts, a batch from domains 0
    and 1 only. Eq. 2's non-expert ensemble of sample 0 is experts 1 AND 2 (Dassl's
    reference would use expert 1 alone, the only other domain in the batch)."""
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    strong = torch.tensor(
        [[[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]], [[0.5, 0.5], [0.3, 0.7], [0.7, 0.3]]], dtype=torch.float64
    )
    loss = consistency_loss(target, strong.log(), torch.tensor([0, 1]))
    # sample 0: mean(experts 1, 2) = (0.4, 0.6) -> (1-0.4)^2 + 0.6^2 = 0.72
    # sample 1: mean(experts 0, 2) = (0.6, 0.4) -> 0.6^2 + (1-0.4)^2 = 0.72
    assert loss.item() == pytest.approx(0.72, abs=1e-12)


def test_split_domains_refuses_batches_that_are_not_domain_chunks():
    from dael_plugin.data.batching import split_domains
    from dael_plugin.errors import DAELConfigError

    chunks, idx = split_domains(torch.tensor([0, 0, 2, 2, 1, 1]), 2, 3)
    assert chunks == [2, 2, 2] and idx.tolist() == [0, 0, 2, 2, 1, 1]
    for bad, why in [
        ([0, 1, 0, 1], "contiguous single-domain"),
        ([0, 0, 1], "does not split"),
        ([0, 0, 3, 3], "contiguous single-domain"),
    ]:
        with pytest.raises(DAELConfigError, match=why):
            split_domains(torch.tensor(bad), 2, 3)
