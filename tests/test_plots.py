"""scripts/plots.py on small fixtures: each figure's files, axes and labels."""

import json
import os
import shutil

import pytest

pytest.importorskip("matplotlib")


def _rec(root, target, seed, acc, losses="ce_cr_u", weight_u=0.5, experts=(60.0, 70.0, 65.0)):
    d = os.path.join(root, "EmbeddedDigits", "DAEL", f"L={losses},W={weight_u}", target, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    config = f"TRAINER:\n  DAEL:\n    LOSSES: {losses}\n    WEIGHT_U: {weight_u}\n    CLASSIFIER: experts\n"
    rec = {
        "dataset": "EmbeddedDigits",
        "trainer": "DAEL",
        "target_domains": [target],
        "seed": seed,
        "accuracy": acc,
        "expert_accuracy": dict(zip(["hand", "street", "font"], experts)),
        "provenance": {"config": config},
    }
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(rec, f)
    return d


@pytest.fixture
def seen(monkeypatch):
    """Each figure's axes (x label, y label, title) and lines (label, y data), by name, as saved."""
    from dael_plugin.tools import plots

    seen = {}
    real = plots._save

    def spy(fig, out, name):
        seen[name] = [(ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) for ax in fig.axes]
        seen[name + "_lines"] = [[(ln.get_label(), list(ln.get_ydata())) for ln in ax.get_lines()] for ax in fig.axes]
        seen[name + "_ylim"] = [tuple(ax.get_ylim()) for ax in fig.axes]
        seen[name + "_suptitle"] = fig._suptitle.get_text() if fig._suptitle is not None else ""
        seen[name + "_legends"] = [[t.get_text() for t in lg.get_texts()] for lg in fig.legends]
        seen[name + "_notes"] = [[t.get_text() for t in ax.texts] for ax in fig.axes]
        seen[name + "_bars"] = [
            [[p.get_height() for p in c.patches] for c in ax.containers if hasattr(c, "patches")] for ax in fig.axes
        ]
        return real(fig, out, name)

    from dael_plugin.tools import model_figures

    monkeypatch.setattr(plots, "_save", spy)
    monkeypatch.setattr(model_figures, "_save", spy)  # top3 and tsne are drawn there
    return seen


def test_every_figure_from_a_fixture_sweep(tmp_path, seen):
    from torch.utils.tensorboard import SummaryWriter

    from dael_plugin.tools import plots

    root = str(tmp_path / "sweep")
    for seed in (1, 2):
        for losses, acc in (("ce", 60.0), ("ce_cr", 65.0), ("ce_cr_u", 70.0)):
            _rec(root, "blend", seed, acc + seed, losses=losses)
        for w in (0.0, 1.0):
            _rec(root, "blend", seed, 66.0 + w + seed, weight_u=w)
    for seed, shift in ((1, 0.0), (2, 0.2)):
        run = _rec(root, "street", seed, 50.0)
        writer = SummaryWriter(os.path.join(run, "tensorboard"))
        for step, (m, a) in enumerate([(0.1, 80.0), (0.4, 85.0), (0.6, 90.0)]):
            writer.add_scalar("train/mask_u", m + shift, step)
            writer.add_scalar("train/pl_acc_u", a + 10 * shift, step)
        writer.close()
    ablated = _rec(root, "street", 3, 40.0, weight_u=0.0)  # not at the defaults: not in the curves
    writer = SummaryWriter(os.path.join(ablated, "tensorboard"))
    writer.add_scalar("train/mask_u", 0.9, 0)
    writer.close()

    out = tmp_path / "figs"
    assert plots.main([root, "--out", str(out)]) == 0
    for name in ("loss_ablation", "weight_u", "experts", "curves"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").exists(), name
    assert seen["loss_ablation"][0][:2] == ("target domain", "target test accuracy (%)")
    assert seen["weight_u"][0][0].startswith(r"$\lambda_u$") and "Fig. 5" in seen["weight_u"][0][2]
    assert all(ylabel == "target test accuracy (%)" for _, ylabel, _ in seen["experts"])
    assert [a[1] for a in seen["curves"]] == ["pseudo-labels kept (%)", "accuracy of kept pseudo-labels (%)"]
    (mask,), (pl,) = seen["curves_lines"]  # one line per target: the mean over its two default runs
    assert mask[0] == "street (2 seeds)" and mask[1] == pytest.approx([20.0, 50.0, 70.0])
    assert pl[1] == pytest.approx([81.0, 86.0, 91.0])
    assert seen["curves_notes"] == [[], []]  # both panels have lines: no note
    # The axes show the differences: the mask rate from 0, the pseudo-label accuracy (80 to 93
    # over the seeds) from under its lowest value, the experts' bars (blend 60 to 72, street 50
    # to 70) not from 0 but from under their lowest bar.
    assert seen["curves_ylim"] == [(0.0, 100.0), (75.0, 100.0)]
    (b_low, b_high), (s_low, s_high) = seen["experts_ylim"]
    assert 50.0 < b_low < 60.0 and 40.0 < s_low < 50.0 and 72.0 < b_high <= 100.0 and 70.0 < s_high <= 100.0


def test_curves_without_a_kept_pseudo_label_say_so(tmp_path, seen):
    """After a short sweep no prediction reached CONF_THRE: the accuracy panel says why it is empty."""
    from torch.utils.tensorboard import SummaryWriter

    from dael_plugin.tools import plots

    run = _rec(str(tmp_path), "street", 1, 50.0)
    writer = SummaryWriter(os.path.join(run, "tensorboard"))
    for step in range(3):
        writer.add_scalar("train/mask_u", 0.0, step)
    writer.close()
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "f"), "--only", "curves"]) == 0
    mask_notes, pl_notes = seen["curves_notes"]
    assert mask_notes == [] and len(pl_notes) == 1 and pl_notes[0].startswith("no pseudo-label was kept")


def test_figures_the_sweep_cannot_support_are_skipped_with_a_reason(tmp_path, capsys):
    from dael_plugin.tools import plots

    _rec(str(tmp_path), "blend", 1, 70.0)
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "loss_ablation: skipped (loss_ablation needs DAEL runs with at least two of" in out
    assert "experts: " in out and "experts.png" in out
    assert plots.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "f")]) == 2


def test_a_figure_never_averages_runs_of_other_settings_as_seeds(tmp_path, capsys, seen):
    """Hand-worked: the loss ablation at 15 epochs (blend: ce 61 and 62, ce_cr_u 71 and 72), and
    a seed of ce_cr_u at 30 epochs (90). Averaged as seeds, ce_cr_u's bar would be 77.67 over 3
    'seeds'; the figure is skipped naming OPTIM.MAX_EPOCH, and drawn again once the 30-epoch run
    is moved out. A rerun of seed 1 (another folder, the same setting) counts once."""
    from dael_plugin.tools import plots

    root = str(tmp_path / "sweep")
    for seed in (1, 2):
        for losses, acc in (("ce", 60.0), ("ce_cr_u", 70.0)):
            _rec(root, "blend", seed, acc + seed, losses=losses)
    default = os.path.dirname(os.path.dirname(_rec(root, "blend", 1, 71.0)))  # .../DAEL/L=ce_cr_u,W=0.5
    with open(os.path.join(default, "blend", "seed1", "results.json")) as f:
        rec = json.load(f)
    longer = os.path.join(default + ",E=30", "blend", "seed1")
    os.makedirs(longer)
    with open(os.path.join(longer, "results.json"), "w") as f:
        json.dump(
            dict(rec, accuracy=90.0, provenance={"config": rec["provenance"]["config"] + "OPTIM:\n  MAX_EPOCH: 30\n"}),
            f,
        )
    out = str(tmp_path / "f")
    assert plots.main([root, "--out", out, "--only", "loss_ablation", "experts"]) == 0
    said = capsys.readouterr().out
    assert "loss_ablation: skipped (the runs of loss_ablation differ in OPTIM.MAX_EPOCH besides LOSSES" in said, said
    assert "experts: skipped (the runs of experts differ in OPTIM.MAX_EPOCH" in said and "loss_ablation" not in seen
    shutil.rmtree(default + ",E=30")
    shutil.copytree(default, default + ",rerun")
    assert plots.main([root, "--out", out, "--only", "loss_ablation", "experts"]) == 0
    assert "skipped" not in capsys.readouterr().out
    ((ce, full),) = seen["loss_ablation_bars"]
    assert seen["experts"][0][2] == "target blend (2 seeds)" and (ce, full) == ([61.5], [71.5])


def test_top3_and_tsne_from_real_checkpoints(tmp_path, tiny_root, capsys, seen):
    """Fig. 7 and Fig. 8 rebuild the models of a DAEL and a SourceOnly run (built-in engine)."""
    from dael_plugin.tools import plots
    from test_hardening import args_for, cli

    sweep = tmp_path / "sweep"
    so_cfg = os.path.join(os.path.dirname(__file__), "..", "configs/trainers/da/source_only/embedded_digits.yaml")
    # An ablation whose folder sorts first: Fig. 7 and 8 must not draw it (they drew the first DAEL run).
    single = sweep / "EmbeddedDigits" / "DAEL" / "CLASSIFIER=single" / "street" / "seed3"
    assert cli(args_for(tiny_root, single, extra=["TRAINER.DAEL.CLASSIFIER", "single"]), capsys)[0] == 0
    assert cli(args_for(tiny_root, sweep / "EmbeddedDigits" / "DAEL" / "street" / "seed3"), capsys)[0] == 0
    assert (
        cli(
            args_for(
                tiny_root,
                sweep / "EmbeddedDigits" / "SourceOnly" / "street" / "seed3",
                trainer="SourceOnly",
                cfg=so_cfg,
            ),
            capsys,
        )[0]
        == 0
    )
    assert plots.main([str(sweep), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    assert "top3: " in out and "tsne: " in out and "skipped (top3" not in out and "skipped (tsne" not in out
    assert (tmp_path / "figs" / "top3.png").exists() and (tmp_path / "figs" / "tsne.pdf").exists()
    assert [t for _, _, t in seen["tsne"]] == [
        "SourceOnly (defaults), target street, seed 3",
        "DAEL (defaults), target street, seed 3",
    ]
    assert seen["tsne"][0][:2] == ("t-SNE 1", "t-SNE 2")
    # tsne_class says which colour is which class, by the dataset's class names
    ((names,),) = (seen["tsne_class_legends"],)
    assert names and set(names) <= {str(c) for c in range(10)} and names == sorted(names, key=int)
    ylabels = [y for _, y, _ in seen["top3"] if y]
    assert ylabels == ["E[hand]", "E[blend]", "E[font]", "ensemble"]  # one row per expert, then the ensemble
    # A run named with --run is drawn, and the title says which.
    seen.clear()
    # (--run names the run of the two figures drawn from one run's model; the others are drawn above)
    assert (
        plots.main([str(sweep), "--out", str(tmp_path / "figs2"), "--run", str(single), "--only", "top3", "tsne"]) == 0
    )
    assert [t for _, _, t in seen["tsne"]][1] == "DAEL (CLASSIFIER=single), target street, seed 3"
    assert [y for _, y, _ in seen["top3"] if y] == ["classifier"]  # one classifier: no expert rows


def test_fig8_sets_beside_dael_a_source_only_run_of_its_own_task_only(monkeypatch):
    """t-SNE's SourceOnly run is of the DAEL run's dataset, target, sources, backbone and input size
    (its seed first); it took any SourceOnly run, of another target or backbone, where none matched.
    The checkpoints are stood in for: the choice is what is tested."""
    from dael_plugin.tools import model_figures as mf

    monkeypatch.setattr(mf, "LoadedRun", lambda rec: rec)

    def rec(trainer, target, seed, backbone="small_cnn", sources=("hand", "font"), size=(32, 32)):
        config = f"DATASET:\n  SOURCE_DOMAINS: {list(sources)}\nMODEL:\n  BACKBONE:\n    NAME: {backbone}\nINPUT:\n  SIZE: {list(size)}\n"
        return {
            "trainer": trainer,
            "dataset": "Set",
            "target_domains": [target],
            "seed": seed,
            "_dir": f"/r/{trainer}{target}{seed}{backbone}",
            "provenance": {"config": config},
        }

    dael = rec("DAEL", "blend", 2)
    others = [
        rec("SourceOnly", "street", 2),
        rec("SourceOnly", "blend", 2, backbone="resnet18"),
        rec("SourceOnly", "blend", 2, size=(64, 64)),
        rec("SourceOnly", "blend", 2, sources=("hand",)),
    ]
    run, why = mf._pick(others, "SourceOnly", like=dael)
    assert (
        run is None and "dataset=Set, target=blend, sources=font,hand, backbone=small_cnn, input size=32x32" in why
    ), why
    run, why = mf._pick(
        others + [rec("SourceOnly", "blend", 1), rec("SourceOnly", "blend", 2)], "SourceOnly", like=dael
    )
    assert why is None and (run["target_domains"], run["seed"]) == (["blend"], 2)


def test_a_models_figure_rebuilds_a_vit_at_the_runs_input_size(tmp_path, tiny_root, capsys):
    """A timm ViT is built for INPUT.SIZE (its position embedding depends on it): the figures'
    model is rebuilt the same way, so it loads and scores the run's own test accuracy (built at
    timm's default size, its checkpoint did not fit and the figures skipped the run)."""
    import torch

    from dael_plugin.tools.model_figures import LoadedRun
    from test_hardening import args_for, cli

    run = tmp_path / "vit"
    assert cli(args_for(tiny_root, run, extra=["MODEL.BACKBONE.NAME", "timm_test_vit"]), capsys)[0] == 0
    rec = dict(json.loads((run / "results.json").read_text()), _dir=str(run))
    loaded = LoadedRun(rec)
    probs = loaded.features_and_probs(loaded.test)[1]
    right = (loaded.ensemble(probs).argmax(-1) == torch.tensor([i.label for i in loaded.test])).sum().item()
    assert abs(100 * right / len(loaded.test) - rec["accuracy"]) < 1e-3


def test_a_models_figure_masks_the_experts_and_ensemble_as_the_run_did(tmp_path, tiny_root, capsys):
    """Under category shift with every part of CLASS_MASKS on, each expert's probabilities and the
    ensemble's prediction are the run's own: its experts' and ensemble's test accuracies, as
    results.json has them (unmasked, Fig. 7's rows were other predictions than the run's)."""
    import torch
    from test_distributed import _category_shift

    from dael_plugin.tools.model_figures import LoadedRun
    from test_hardening import args_for, cli

    run = tmp_path / "cs"
    assert cli(_category_shift(args_for(tiny_root, run, epochs=2), tiny_root), capsys)[0] == 0
    rec = dict(json.loads((run / "results.json").read_text()), _dir=str(run))
    loaded = LoadedRun(rec)
    mask = loaded.algorithm.ensemble_mask
    assert mask is not None and not mask.all()  # the per-class ensemble; a source lacks some classes
    probs = loaded.features_and_probs(loaded.test)[1]
    labels = torch.tensor([i.label for i in loaded.test])

    def accuracy(p):
        return 100 * (p.argmax(-1) == labels).sum().item() / len(labels)

    assert abs(accuracy(loaded.ensemble(probs)) - rec["accuracy"]) < 1e-3
    with torch.no_grad():  # the probabilities too: the run's test-time prediction (core's DAEL.predict)
        assert torch.allclose(loaded.ensemble(probs), loaded.algorithm.predict(loaded._tensor(loaded.test)))
    for k, name in enumerate(rec["expert_accuracy"]):
        assert abs(accuracy(probs[:, k]) - rec["expert_accuracy"][name]) < 1e-3, name


def test_a_models_figure_refuses_a_dassl_model_with_a_head_it_cannot_rebuild(tmp_path):
    """A Dassl-engine DAEL run with MODEL.HEAD: its experts read the head's output, which the
    figures do not rebuild. Of the same width as the backbone it loaded without a complaint and
    drew the experts on the wrong features; it is refused, so the figure is skipped with why."""
    import torch
    import yaml

    from dael_plugin.backbones import build_backbone
    from dael_plugin.engine.checkpoint import LAST, save_checkpoint
    from dael_plugin.tools.model_figures import LoadedRun

    net = build_backbone("dael_small_cnn")
    d = net.out_features
    f_state = {f"backbone.{k}": v for k, v in net.state_dict().items()}
    f_state.update({"head.mlp.0.weight": torch.zeros(d, d), "head.mlp.0.bias": torch.zeros(d)})
    e_state = {"weight": torch.zeros(3, 10, d), "bias": torch.zeros(3, 10)}
    save_checkpoint({"engine": "dassl", "models": {"F": f_state, "E": e_state}}, str(tmp_path / LAST))
    config = {"MODEL": {"BACKBONE": {"NAME": "dael_small_cnn"}, "HEAD": {"NAME": "mlp"}}, "INPUT": {"SIZE": [32, 32]}}
    rec = {"provenance": {"config": yaml.safe_dump(config)}, "_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="MODEL.HEAD"):
        LoadedRun(rec)


def test_experts_with_one_seed_says_one_seed_and_no_spread(tmp_path, seen):
    from dael_plugin.tools import plots

    _rec(str(tmp_path), "blend", 1, 70.0)
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "f"), "--only", "experts"]) == 0
    ((xlabel, ylabel, title),) = seen["experts"]
    assert title == "target blend (1 seed)"
    assert "one seed, so no spread is shown" in seen["experts_suptitle"]


@pytest.mark.parametrize("bad", [["a", "list"], {"hand": "60"}, {"hand": 1e5}, "60"])
def test_a_hand_edited_expert_accuracy_is_named_not_a_traceback(tmp_path, capsys, bad):
    """expert_accuracy of the wrong type (a list, a string, 1e5) gave plots.py a TypeError traceback:
    the record is named as edited and left out; the other runs still make their figures."""
    from dael_plugin.tools import plots

    _rec(str(tmp_path), "blend", 1, 70.0)
    d = _rec(str(tmp_path), "blend", 2, 72.0)
    path = os.path.join(d, "results.json")
    rec = json.load(open(path))
    rec["expert_accuracy"] = bad
    json.dump(rec, open(path, "w"))
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "f"), "--only", "experts"]) == 0
    out, err = capsys.readouterr()
    assert "expert_accuracy is not a mapping of names to percentages" in err and path in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("bad", ["TRAINER: [1, 2\n  bad: :", "- a list", {"TRAINER": {}}, "a string"])
def test_a_hand_edited_config_in_a_record_is_named_not_a_traceback(tmp_path, capsys, bad):
    """provenance.config that is not YAML gave plots.py a YAMLError traceback (a YAML list or a
    provenance that is a string, an AttributeError), and collect read it as a record without a
    config, a setting of none of its keys: the record is named as edited, collect marks its cell
    corrupt, the other runs still make their figures."""
    from dael_plugin.tools import collect, plots

    _rec(str(tmp_path), "blend", 1, 70.0)
    d = _rec(str(tmp_path), "blend", 2, 72.0)
    path = os.path.join(d, "results.json")
    rec = json.load(open(path))
    if bad == "a string":
        rec["provenance"] = bad
    else:
        rec["provenance"]["config"] = bad
    json.dump(rec, open(path, "w"))
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "f"), "--only", "experts"]) == 0
    out, err = capsys.readouterr()
    assert "is not the run's config as YAML" in err and path in err and "Traceback" not in out + err
    assert (tmp_path / "f" / "experts.png").exists()
    assert collect.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "is not the run's config as YAML" in err and "70.00 ± 0.00 [1 not done]" in out, out
