"""The unsupervised validators against numbers worked by hand (dael_plugin.core.validators)."""

import math
import os

import pytest
import torch

from dael_plugin.core import validators as V

LN2 = math.log(2)


def test_entropy_and_im_by_hand():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    # H = [0, ln 2]; the score is minus their mean
    assert V.entropy_score(p).item() == pytest.approx(-LN2 / 2)
    # mean prediction [0.75, 0.25]: H = -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.562335
    diversity = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert V.im_score(p).item() == pytest.approx(diversity - LN2 / 2)
    assert V.im_score(p).item() == pytest.approx(0.215762, abs=1e-6)
    # confident and diverse beats confident and collapsed
    assert V.im_score(torch.eye(2)).item() == pytest.approx(LN2)
    assert V.im_score(torch.tensor([[1.0, 0.0], [1.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_bnm_by_hand():
    # identity: singular values 1, 1 -> nuclear norm 2, over N = 2
    assert V.bnm_score(torch.eye(2)).item() == pytest.approx(1.0)
    # both rows the same class: one singular value sqrt(2), over 2
    assert V.bnm_score(torch.tensor([[1.0, 0.0], [1.0, 0.0]])).item() == pytest.approx(math.sqrt(2) / 2)
    # uniform rows: rank one, singular value sqrt(N * 0.5) = 1 for N = 2, C = 2 -> 0.5
    assert V.bnm_score(torch.full((2, 2), 0.5)).item() == pytest.approx(0.5)
    # N = 3, C = 2: P^T P = diag(2, 1), singular values sqrt(2) and 1, over N = 3
    assert V.bnm_score(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])).item() == pytest.approx(
        (math.sqrt(2) + 1) / 3
    )


def test_snd_by_hand():
    # samples 1 and 2 are the same class, 3 another: cosine similarities s12 = 1, s13 = s23 = 0.
    p = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    q = 1 / (1 + math.exp(-1 / 0.05))  # row 1: softmax of [s12, s13] / tau = [20, 0]
    h_close = -(q * math.log(q) + (1 - q) * math.log(1 - q))
    expected = (2 * h_close + LN2) / 3  # row 3: [0, 0] / tau -> uniform over its two neighbours
    assert V.snd_score(p).item() == pytest.approx(expected, rel=1e-5)
    # the same in blocks of one row (the blocking changes nothing)
    assert V.snd_score(p, block=1).item() == pytest.approx(expected, rel=1e-5)
    a = 1 / (1 + math.exp(-1.0))  # tau = 1: softmax of [1, 0]
    h = -(a * math.log(a) + (1 - a) * math.log(1 - a))
    assert V.snd_score(p, tau=1.0).item() == pytest.approx((2 * h + LN2) / 3, rel=1e-5)


def test_expert_agreement_and_mask_rate_by_hand():
    # sample 1: experts say 0, 0, 1 (ensemble 0) -> 2/3; sample 2: all say 1 -> 1
    e = torch.tensor(
        [
            [[0.96, 0.04], [0.6, 0.4], [0.3, 0.7]],
            [[0.2, 0.8], [0.1, 0.9], [0.4, 0.6]],
        ]
    )
    assert V.expert_agreement(e).item() == pytest.approx((2 / 3 + 1) / 2)
    # the most confident expert: 0.96 (>= 0.95: kept), 0.9 (dropped)
    assert V.mask_rate(e, 0.95).item() == pytest.approx(0.5)
    assert V.mask_rate(e, 0.9).item() == pytest.approx(1.0)


def test_dev_risk_by_hand():
    # w = [0.5, 1.5], e = [2, 0]: l = [1, 0]; cov(l, w) = -0.5, var(w) = 0.5, eta = 1;
    # risk = mean(l) + eta * mean(w) - eta = 0.5 + 1 - 1 = 0.5
    assert V.dev_risk(torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.0])).item() == pytest.approx(0.5)
    # equal errors: the control variate removes the weights entirely, risk = the error
    w = torch.tensor([0.1, 3.0, 0.7, 9.0])
    assert V.dev_risk(w, torch.full((4,), 0.3)).item() == pytest.approx(0.3)
    # equal weights: no variance, eta = 0, the plain mean
    assert V.dev_risk(torch.ones(3), torch.tensor([1.0, 2.0, 6.0])).item() == pytest.approx(3.0)
    # DEVN: w / max = [1/3, 1], shifted to mean 1 -> [2/3, 4/3]; l = [4/3, 0]; cov = -4/9,
    # var = 2/9, eta = 2; risk = 2/3 + 2 * 1 - 2 = 2/3
    got = V.dev_risk(torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.0]), normalize=True).item()
    assert got == pytest.approx(2 / 3)


def test_density_ratios_see_the_shift():
    g = torch.Generator().manual_seed(0)
    src = torch.randn(400, 4, generator=g)
    tgt_same = torch.randn(200, 4, generator=g)
    tgt_far = torch.randn(200, 4, generator=g) + torch.tensor([3.0, 0, 0, 0])
    val = torch.randn(100, 4, generator=g)
    w_same, acc_same = V.density_ratios(src, tgt_same, val)
    w_far, acc_far = V.density_ratios(src, tgt_far, val)
    # alike domains: the classifier is near the prior (2/3 source), the ratios near N_s/N_t * 1/2 = 1
    assert acc_same.item() < 0.75 and w_same.mean().item() == pytest.approx(1.0, abs=0.35)
    # shifted target: the classifier separates, and the source samples nearest the target weigh most
    assert acc_far.item() > 0.9
    order = w_far.argsort()
    assert val[order[-10:], 0].mean() > val[order[:10], 0].mean() + 1.0


def test_class_ami_by_hand():
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(3) * 10
    feats = torch.cat([centres[c] + 0.1 * torch.randn(20, 3, generator=g) for c in range(3)])
    truth = torch.arange(3).repeat_interleave(20)
    assert V.class_ami(feats, truth, 3) == pytest.approx(1.0)
    assert V.class_ami(feats, (truth + 1) % 3, 3) == pytest.approx(1.0)  # the names of clusters do not matter
    noise = torch.randint(3, (60,), generator=g)
    assert abs(V.class_ami(feats, noise, 3)) < 0.15
    # with the source's true labels beside the target's predictions
    assert V.class_ami(feats[:30], truth[:30], 3, source_feats=feats[30:], source_labels=truth[30:]) == pytest.approx(
        1.0
    )


def test_validators_prefer_the_better_checkpoint():
    """Not a proof, a sanity check: on a target whose clusters are the classes, a model that
    predicts them confidently outscores one that hedges, under every validator that reads
    predictions."""
    g = torch.Generator().manual_seed(0)
    truth = torch.arange(4).repeat_interleave(25)
    good = torch.nn.functional.one_hot(truth, 4).float() * 0.9 + 0.025
    hedge = torch.full((100, 4), 0.25) + 0.05 * torch.rand(100, 4, generator=g)
    hedge = hedge / hedge.sum(1, keepdim=True)
    for fn in (V.entropy_score, V.im_score, V.bnm_score):
        assert fn(good) > fn(hedge), fn.__name__
    # SND is left out: it scores a set whose predictions all hedge alike as one dense neighbourhood
    # (every cosine similarity near 1), higher than clean clusters: Musgrave et al. report it can
    # reward such collapse, which is why validators are ranked, not trusted one by one.
    assert V.snd_score(hedge) > V.snd_score(good)


def test_macro_f1_is_dassls_by_hand_and_equals_scikit_learns():
    """Labels 0 0 1 1, predictions 0 1 1 2. Class 0: tp 1, fn 1 -> F1 2/3; class 1: tp 1, fp 1,
    fn 1 -> 1/2; class 2 is not among the labels, so (Dassl's labels=np.unique(y_true)) it is
    not averaged: 58.33%. Averaging over every class seen would give 38.89, micro-F1 50.
    Then random cases against scikit-learn's own, the reference the evaluator used to import."""
    import numpy as np
    from sklearn.metrics import f1_score

    from dael_plugin.engine.evaluate import macro_f1

    assert macro_f1([0, 0, 1, 1], [0, 1, 1, 2]) == pytest.approx(100 * (2 / 3 + 1 / 2) / 2, abs=1e-9)
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, c = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        y, p = rng.integers(0, c, n), rng.integers(0, c + 2, n)
        want = 100.0 * f1_score(y, p, average="macro", labels=np.unique(y), zero_division=0)
        assert macro_f1(y, p) == pytest.approx(want, abs=1e-9), (y, p)


def test_per_class_result_is_dassls_by_hand():
    """TEST.PER_CLASS_RESULT's ``perclass_accuracy``: labels 0 0 1 1 1 3, predictions 0 1 1 1 0 2.
    Class 0: 1 of 2, class 1: 2 of 3, class 3: 0 of 1; class 2 has no test image and counts for
    nothing (Dassl's evaluator averages over the labels it saw): (50 + 66.67 + 0) / 3 = 38.89.
    Over all four classes it would be 29.17, and the plain accuracy is 50."""
    from dael_plugin.engine.evaluate import classification_results

    results, lines = classification_results([0, 0, 1, 1, 1, 3], [0, 1, 1, 1, 0, 2], ["a", "b", "c", "d"], True)
    assert results["perclass_accuracy"] == pytest.approx((50 + 200 / 3 + 0) / 3, abs=1e-9)
    assert results["accuracy"] == 50.0 and results["error_rate"] == 50.0
    assert lines[6:] == [
        "=> per-class result",
        "* class: 0 (a)\ttotal: 2\tcorrect: 1\tacc: 50.0%",
        "* class: 1 (b)\ttotal: 3\tcorrect: 2\tacc: 66.7%",
        "* class: 3 (d)\ttotal: 1\tcorrect: 0\tacc: 0.0%",
        "* average: 38.9%",
    ]
    assert "perclass_accuracy" not in classification_results([0, 1], [0, 0], ["a", "b"])[0]
    from dael_plugin.engine.evaluate import mean_class_accuracy  # results.json's, on every run

    assert mean_class_accuracy([0, 0, 1, 1, 1, 3], [0, 1, 1, 1, 0, 2]) == results["perclass_accuracy"]


@pytest.mark.dassl
@pytest.mark.parametrize("per_class", [False, True])
def test_the_evaluator_is_dassls(tmp_path, capsys, per_class):
    """The built-in engine's results, printed lines and ``cmat.pt`` against Dassl's ``Classification``
    evaluator on the same labels and predictions (classes missing from the labels, predictions of
    classes the labels lack)."""
    import numpy as np
    import torch
    from dassl.config import get_cfg_default
    from dassl.evaluation import build_evaluator

    from dael_plugin.engine.evaluate import classification_results, save_confusion_matrix

    rng = np.random.default_rng(3)
    y, p = rng.integers(0, 6, 200), rng.integers(0, 8, 200)
    y[y == 4] = 5  # class 4 has no test image
    names = [f"class{k}" for k in range(8)]
    cfg = get_cfg_default()
    cfg.TEST.PER_CLASS_RESULT, cfg.TEST.COMPUTE_CMAT, cfg.OUTPUT_DIR = per_class, True, str(tmp_path / "dassl")
    os.makedirs(cfg.OUTPUT_DIR)
    ev = build_evaluator(cfg, lab2cname=dict(enumerate(names)))
    ev.process(torch.nn.functional.one_hot(torch.as_tensor(p), 8).float(), torch.as_tensor(y))
    capsys.readouterr()
    want = ev.evaluate()
    said = capsys.readouterr().out.splitlines()
    results, lines = classification_results(y, p, names, per_class)
    assert list(results) == list(want) and all(results[k] == pytest.approx(want[k], abs=1e-9) for k in want)
    assert lines == said[: len(lines)] and said[len(lines)].startswith("Confusion matrix is saved to")
    ours = tmp_path / "ours"
    ours.mkdir()
    core = getattr(np, "_core", None) or np.core  # NumPy 2's name, else 1's
    array = [np.ndarray, np.dtype, type(np.dtype(np.float64)), core.multiarray._reconstruct]
    with torch.serialization.safe_globals(array):  # a NumPy array, as Dassl saves it: no code
        got = torch.load(save_confusion_matrix(y, p, str(ours)), weights_only=True)
        want = torch.load(os.path.join(cfg.OUTPUT_DIR, "cmat.pt"), weights_only=True)
    np.testing.assert_array_equal(got, want)


def test_a_runs_mean_class_accuracy_is_its_tests_not_its_accuracy(tiny_root, tmp_path):
    """The built-in engine's test on an unbalanced split (class 0's 6 images, one image of each other
    class) of a model that says class 0 everywhere: accuracy 6/15 = 40%, mean class accuracy 10%:
    the trainer's mean class accuracy, which results.json records, is the mean over the classes of
    the predictions it scored, not the plain accuracy (on the balanced embedded set the two are
    equal, so only a split like this one tells them apart)."""
    import torch
    from test_contract import build

    from dael_plugin.engine.evaluate import macro_f1, mean_class_accuracy
    from dael_plugin.engine.results import Evaluation, results_record

    tr = build("SourceOnly", tiny_root, tmp_path / "run")
    items = tr.splits["test"]
    first = {}
    for item in items:
        first.setdefault(item.label, item)
    subset = [i for i in items if i.label == 0] + [i for c, i in sorted(first.items()) if c != 0]
    tr.test_loader = tr._test_loader(subset)

    def class_zero(x):  # a model that says class 0 for every image
        return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), tr.num_classes).float()[:, None]

    tr.predict_experts = class_zero
    with torch.no_grad():
        got = tr.test()
        preds = torch.cat([tr.predict_experts(b["img"]).mean(1).argmax(-1) for b in tr.test_loader])
    labels = torch.tensor([i.label for i in subset])
    want = mean_class_accuracy(labels, preds)
    assert tr.mean_class_accuracy == pytest.approx(want, abs=1e-9)
    assert got == pytest.approx(100.0 * float((preds == labels).double().mean()), abs=1e-9)
    assert (round(got, 2), round(want, 2)) == (40.0, 10.0)  # 6 of 15 images right; 1 of 10 classes
    record = results_record(tr.cfg, "builtin", got, Evaluation.of(tr), "DA")
    assert record["mean_class_accuracy"] == round(want, 4) and record["accuracy"] == round(got, 4)
    # class 0: 6 right, 9 wrongly called class 0 -> F1 12/21; the nine others 0: macro F1 (12/21)/10
    assert record["macro_f1"] == round(100 * (12 / 21) / 10, 4) == round(macro_f1(labels, preds), 4)


@pytest.mark.dassl
def test_the_dassl_engines_class_metrics_are_dassls_perclass_accuracy_and_macro_f1():
    """What the Dassl engine records for every trainer: the mean class accuracy and the macro F1 of
    the labels and predictions Dassl's ``Classification`` evaluator kept, equal to its own
    ``perclass_accuracy`` and ``macro_f1`` on an unbalanced split (where the plain accuracy differs);
    None for an evaluator without them."""
    import torch
    from dassl.config import get_cfg_default
    from dassl.evaluation import build_evaluator

    from dael_plugin.tools.train_engines import dassl_class_metrics

    cfg = get_cfg_default()
    cfg.TEST.PER_CLASS_RESULT = True
    ev = build_evaluator(cfg, lab2cname={i: str(i) for i in range(4)})
    labels, preds = torch.tensor([0, 0, 0, 0, 1, 2, 3]), torch.zeros(7, dtype=torch.long)
    ev.process(torch.nn.functional.one_hot(preds, 4).float(), labels)
    want = ev.evaluate()
    mean_class, f1 = dassl_class_metrics(ev)
    assert mean_class == pytest.approx(want["perclass_accuracy"], abs=1e-9) == 25.0
    assert f1 == pytest.approx(want["macro_f1"], abs=1e-9) == pytest.approx(100 * (8 / 11) / 4)  # class 0's F1 alone
    assert want["accuracy"] == pytest.approx(400 / 7)
    assert dassl_class_metrics(object()) == (None, None)


def test_an_epoch_record_holds_the_tests_class_metrics_by_hand():
    """Labels 0, 0, 1, 1 predicted 0, 1, 1, 2: accuracy 50%, mean class accuracy (50 + 50) / 2 = 50%,
    macro F1 over the test's classes (2/3 + 1/2) / 2 = 58.33% (over every class predicted as well,
    the union scikit-learn takes by default, it would be 38.89%)."""
    import torch

    from dael_plugin.engine import selection as S

    probs = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 2]), 3).float()[:, None]
    test = S.Outputs(torch.zeros(4, 2), probs, torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.long))
    rec = S.epoch_record(1, {"test": test}, S.Scoring(["a", "b"], 3, 0.95, 0, (), da=False))
    assert rec["target_test_accuracy"] == 50.0 and rec["target_test_mean_class_accuracy"] == 50.0
    assert rec["target_test_macro_f1"] == round(100 * (2 / 3 + 1 / 2) / 2, 4) == 58.3333
