"""collect.py --select and --validators on fixture sweeps (dael_plugin/tools/select.py)."""

import json
import math
import os

import pytest

from dael_plugin.tools import collect
from dael_plugin.tools import select as sel


def _run(root, setting, target, seed, epochs, trainer="DAEL", sources=("a", "b", "c"), table_setting="DA"):
    d = os.path.join(root, "Set", trainer, setting, target, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    last = epochs[-1]
    rec = {
        "accuracy": last["target_test_accuracy"],
        "target_domains": [target],
        "source_domains": list(sources),
        "dataset": "Set",
        "trainer": trainer,
        "seed": seed,
        "setting": table_setting,
        "epochs": last["epoch"],
    }
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(rec, f)
    with open(os.path.join(d, "epochs.jsonl"), "w") as f:
        for e in epochs:
            f.write(json.dumps(e) + "\n")
    return d


def _ep(epoch, test, src=None, tval=None, **validators):
    r = {"epoch": epoch, "target_test_accuracy": test}
    if src is not None:
        r["source_val_accuracy"] = src
    if tval is not None:
        r["target_val_accuracy"] = tval
    if validators:
        r["validators"] = validators
    return r


@pytest.fixture
def sweep(tmp_path):
    """Two settings x two seeds, three epochs; the protocols disagree by construction:
    - last: the last epoch; the setting with the better last-epoch source_val (lam=1: 60 > 55);
    - source_val: lam=0.5 epoch 2 (src 70);
    - im: lam=0.5 epoch 1 (im 0.9);
    - oracle: last epoch, the better target_val (lam=0.5: 80 > 50)."""
    root = str(tmp_path / "sweep")
    for seed, bump in ((1, 0.0), (2, 1.0)):
        _run(
            root,
            "lam=0.5",
            "t",
            seed,
            [
                _ep(1, 40 + bump, 50, 30, im=0.9),
                _ep(2, 50 + bump, 70, 40, im=0.1),
                _ep(3, 45 + bump, 55, 80, im=0.2),
            ],
        )
        _run(
            root,
            "lam=1",
            "t",
            seed,
            [
                _ep(1, 30 + bump, 20, 10, im=0.3),
                _ep(2, 35 + bump, 40, 20, im=0.4),
                _ep(3, 60 + bump, 60, 50, im=0.5),
            ],
        )
    return root


def _cell(root, protocol, per_setting=False):
    ((table, targets, cells),) = sel.select(root, protocol, per_setting)
    return cells


def test_protocols_choose_setting_and_epoch_per_seed(sweep):
    cases = {
        "last": ("DAEL/lam=1", 3, [60.0, 61.0]),
        "source_val": ("DAEL/lam=0.5", 2, [50.0, 51.0]),
        "im": ("DAEL/lam=0.5", 1, [40.0, 41.0]),
        "oracle": ("DAEL/lam=0.5", 3, [45.0, 46.0]),
    }
    for protocol, (setting, epoch, values) in cases.items():
        cell = _cell(sweep, protocol)["DAEL"]["t"]
        assert cell.values == values, protocol
        assert {(c.setting, c.epoch) for c in cell.choices.values()} == {(setting, epoch)}, protocol
    # std of [50, 51] = 0.71; standard error 0.5
    assert _cell(sweep, "source_val")["DAEL"]["t"].text() == "50.50 ± 0.71 [0.50]"
    per = _cell(sweep, "source_val", per_setting=True)
    assert per["DAEL/lam=1"]["t"].values == [60.0, 61.0] and per["DAEL/lam=0.5"]["t"].values == [50.0, 51.0]


def test_no_protocol_but_the_oracle_reads_target_labels(sweep):
    """Scramble every target-labelled figure a protocol could read as a score (target_val_accuracy):
    every other protocol keeps its choices."""
    before = {p: _cell(sweep, p)["DAEL"]["t"].choices for p in sel.PROTOCOLS if p != "leave_one_domain_out"}
    for dirpath, _, files in os.walk(sweep):
        if "epochs.jsonl" in files:
            path = os.path.join(dirpath, "epochs.jsonl")
            recs = [json.loads(x) for x in open(path)]
            for i, r in enumerate(recs):
                r["target_val_accuracy"] = 99 - i if "lam=1" in dirpath else i  # lam=1 now the better
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in recs)
    after = {p: _cell(sweep, p)["DAEL"]["t"].choices for p in before}
    assert {p: v for p, v in before.items() if p != "oracle"} == {p: v for p, v in after.items() if p != "oracle"}
    assert before["oracle"] != after["oracle"]


def test_a_damaged_record_leaves_its_seed_out_and_says_so(sweep, capsys):
    """A line that is no record leaves that seed's runs out of the cell, named (choosing among the
    other epochs would be a choice the protocol did not make); the cell says how many were left out."""
    path = os.path.join(sweep, "Set", "DAEL", "lam=0.5", "t", "seed1", "epochs.jsonl")
    with open(path, "a") as f:
        f.write('{"epoch": 4, "target_test\n')
    cell = _cell(sweep, "source_val")["DAEL"]["t"]
    assert cell.values == [51.0] and cell.left_out and "seed 1:" in cell.left_out[0]
    assert cell.text(2) == "51.00 (n=1, 1 left out)"
    assert "line 4: not an epoch record" in capsys.readouterr().out


def test_a_failed_run_leaves_its_seed_out_never_a_choice_among_fewer_settings(sweep):
    """Seed 3 of lam=1 finished (62 at its last epoch) and seed 3 of lam=0.5 failed. Chosen among the
    settings that finished, seed 3 would be lam=1's 62 under every protocol, a choice the sweep
    did not make: its seed is left out of the trainer's cell, named. Per setting, the failure is in
    lam=0.5's row (found by the folders' sweep_run.json), not lam=1's."""
    _run(sweep, "lam=1", "t", 3, [_ep(1, 30, 20, 10, im=0.3), _ep(2, 35, 40, 20, im=0.4), _ep(3, 62, 60, 50, im=0.5)])
    failed = os.path.join(sweep, "Set", "DAEL", "lam=0.5", "t", "seed3")
    os.makedirs(failed)
    open(os.path.join(failed, "failed.json"), "w").write("{}")
    for dirpath, _, _files in os.walk(sweep):
        if dirpath.rsplit(os.sep, 1)[-1].startswith("seed"):
            grid, seed = dirpath.split(os.sep)[-3], dirpath.rsplit("seed", 1)[-1]
            launch = {"trainer": "DAEL", "target": "t", "seed": seed, "grid": grid, "sources": "a b c", "options": ""}
            with open(os.path.join(dirpath, "sweep_run.json"), "w") as f:
                json.dump(launch, f)
    for protocol in ("last", "source_val", "oracle"):
        cell = _cell(sweep, protocol)["DAEL"]["t"]
        assert sorted(cell.choices) == [1, 2] and len(cell.values) == 2, (protocol, cell)
        assert len(cell.left_out) == 1 and cell.left_out[0].startswith(f"seed 3: {failed}: failed"), cell.left_out
        assert "1 left out" in cell.text(2)
    per = _cell(sweep, "last", per_setting=True)
    assert per["DAEL/lam=1"]["t"].values == [60.0, 61.0, 62.0] and not per["DAEL/lam=1"]["t"].left_out
    assert per["DAEL/lam=0.5"]["t"].values == [45.0, 46.0] and per["DAEL/lam=0.5"]["t"].left_out[0].startswith(
        "seed 3:"
    )
    # a grid setting none of whose runs finished (lam=9 diverged on seed 1) still leaves seed 1 out
    diverged = os.path.join(sweep, "Set", "DAEL", "lam=9", "t", "seed1")
    os.makedirs(diverged)
    open(os.path.join(diverged, "failed.json"), "w").write("{}")
    with open(os.path.join(diverged, "sweep_run.json"), "w") as f:
        json.dump(
            {"trainer": "DAEL", "target": "t", "seed": "1", "grid": "lam=9", "sources": "a b c", "options": ""}, f
        )
    cells = _cell(sweep, "last")
    assert list(cells) == ["DAEL"] and sorted(cells["DAEL"]["t"].choices) == [2], cells


HAND_EDITS = {
    "nan accuracy": ('{"epoch": 3, "target_test_accuracy": NaN}', "is not an accuracy in [0, 100]"),
    "1e5": ('{"epoch": 3, "target_test_accuracy": 1e5}', "is not an accuracy in [0, 100]"),
    "a string": ('{"epoch": 3, "target_test_accuracy": "17.5"}', "is not an accuracy in [0, 100]"),
    "renumbered": ('{"epoch": 1, "target_test_accuracy": 40}', "epoch 1 does not come after epoch 3"),
    "past the run": ('{"epoch": 9, "target_test_accuracy": 40}', "epoch 9 is past the run's 3"),
    "a validator string": ('{"epoch": 3, "target_test_accuracy": 40, "validators": {"im": "x"}}', "validator im"),
}


@pytest.mark.parametrize("case", sorted(HAND_EDITS) + ["binary", "fifo", "missing"])
def test_hand_edited_or_damaged_records_are_named_never_a_traceback(sweep, capsys, case):
    """epochs.jsonl edited by hand or damaged: each case one warning naming the file and line, the
    seed left out of --select and of the ranking, exit 0 with the rest; never a traceback."""
    run = os.path.join(sweep, "Set", "DAEL", "lam=1", "t", "seed2")
    path = os.path.join(run, "epochs.jsonl")
    if case == "binary":
        with open(path, "ab") as f:
            f.write(b"\xff\xfe\x00garbage\n")
        said = "line 4: not an epoch record"
    elif case == "fifo":
        os.remove(path)
        os.mkfifo(path)
        said = "is not a regular file"
    elif case == "missing":
        os.remove(path)
        said = None
    else:
        line, said = HAND_EDITS[case]
        if case == "past the run":
            with open(path, "a") as f:
                f.write(line + "\n")
        else:  # replace the last line
            lines = open(path).read().splitlines()
            with open(path, "w") as f:
                f.write("\n".join(lines[:2] + ([line] if case != "renumbered" else [lines[2], line])) + "\n")
    for argv in (["--select", "source_val"], ["--select", "last"], ["--validators"]):
        assert collect.main([sweep, *argv]) == 0, (case, argv)
        out, err = capsys.readouterr()
        if said is not None:
            assert said in err and "left out" in err, (case, argv, err)
        if argv[-1] == "source_val":
            assert "left out: seed 2: " in out and os.path.basename(os.path.dirname(run)) in out, out
    cell = _cell(sweep, "source_val")["DAEL"]["t"]
    assert cell.values == [50.0] and len(cell.left_out) == 1


def test_the_cli_labels_the_oracle_and_says_what_plus_minus_is(sweep, capsys):
    assert collect.main([sweep, "--select", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "UPPER BOUND (reads target labels)" in out and "mean ± std over seeds [standard error]" in out
    assert os.path.isfile(os.path.join(sweep, "select_oracle.md"))
    assert collect.main([sweep, "--select", "nope"]) == 2
    assert "unknown protocol 'nope'" in capsys.readouterr().err
    assert collect.main([sweep, "--validators", "--select", "im"]) == 2  # --select was ignored
    assert "pass one of the two" in capsys.readouterr().err
    assert collect.main([sweep, "--per-setting"]) == 2
    assert "--per-setting goes with --select" in capsys.readouterr().err


def test_leave_one_domain_out_names_the_runs_it_needs_then_uses_them(tmp_path):
    root = str(tmp_path / "dg")
    kw = dict(trainer="DAELDG", table_setting="DG")
    for setting, accs in (("x=1", (50, 60)), ("x=2", (70, 40))):
        _run(root, setting, "t", 1, [_ep(1, accs[0]), _ep(2, accs[1])], sources=("a", "b"), **kw)
    cell = _cell(root, "leave_one_domain_out")["DAELDG"]["t"]
    assert cell.text() == "missing runs"
    assert any("sources b -> target a, seed 1" in m for m in cell.missing)
    assert any("sources a -> target b, seed 1" in m for m in cell.missing)  # both at once, not one per try
    # the runs that leave a (then b) out: x=2 scores best at epoch 1 (mean 90), x=1 at epoch 2 (mean 60)
    for setting, held in (("x=1", ((10, 50), (20, 70))), ("x=2", ((95, 5), (85, 15)))):
        _run(root, setting, "a", 1, [_ep(1, held[0][0]), _ep(2, held[0][1])], sources=("b",), **kw)
        _run(root, setting, "b", 1, [_ep(1, held[1][0]), _ep(2, held[1][1])], sources=("a",), **kw)
    cell = _cell(root, "leave_one_domain_out")["DAELDG"]["t"]
    assert cell.values == [70.0] and cell.choices[1].setting == "DAELDG/x=2" and cell.choices[1].epoch == 1


def test_weighted_spearman_by_hand_and_the_ranking(sweep):
    """Musgrave et al.'s own definition (powerful-benchmarker's weighted_spearman.py with WeightedCorr's
    spearman), by hand on a case where the plausible wrong forms give other answers."""
    assert sel.weighted_spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    # A reversal is not -1: weights [16, 9, 9, 16] / 16 bend the two weighted-rank scales differently
    # (rs = [50, 34, 25, 16], ra = [16, 25, 34, 50] in 16ths): the reference's code gives -0.97106.
    assert sel.weighted_spearman([4, 3, 2, 1], [10, 20, 30, 40]) == pytest.approx(-0.97106, abs=1e-5)
    assert sel.weighted_spearman([4, 3, 2, 1], [10, 20, 30, 40], 0.0) == pytest.approx(-1.0)
    # power 0 is Spearman's rho: ranks s = [1, 2, 4, 3], a = [1, 2, 3, 4]: 1 - 6 * 2 / (4 * 15) = 0.8
    assert sel.weighted_spearman([1, 2, 4, 3], [1, 2, 3, 4], 0.0) == pytest.approx(0.8)
    # The validator scores the worst checkpoint highest: s = [4, 1, 2, 3], a = [1, 2, 3, 4].
    # Dense ranks / max: v = [1, 1/4, 1/2, 3/4], t = [1/4, 1/2, 3/4, 1]; w = max(v, t)^2 = [16, 4, 9, 16] / 16.
    # Weighted ranks (no ties: the weight up to and including each), in 16ths: s in order 1, 2, 3, 4 gives
    # rs = [45, 4, 13, 29]; a gives ra = [16, 20, 29, 45]. With W = 45 and both weighted means 1317 / 45:
    # 45 cov = 45 * 36113 - 1317^2 = -109404; 45 var_s = 45 * 47441 - 1317^2 = 400356;
    # 45 var_a = 45 * 45665 - 1317^2 = 320436; so r = -109404 / sqrt(400356 * 320436) = -0.30545.
    ref = -109404 / math.sqrt(400356 * 320436)
    assert sel.weighted_spearman([4, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(ref, abs=1e-12)
    # The plausible wrong forms, each a distinct answer (worked the same way): weights from the accuracy
    # alone (the form this project had) +0.85619, from the score alone -0.63471, plain ranks under the
    # reference's weights -0.44061, no weights (Spearman) -0.2.
    for wrong in (0.85619, -0.63471, -0.44061, -0.2):
        assert abs(ref - wrong) > 0.1
    # The case: ten checkpoints, the validator's three top scores on the three worst. The
    # reference's own code gives -0.4871 (run by hand against powerful-benchmarker at 2210935); the
    # accuracy-only weights gave +0.6271, ranking this misleading validator above honest ones.
    misleading = sel.weighted_spearman([10, 9, 8, 1, 2, 3, 4, 5, 6, 7], list(range(1, 11)))
    assert misleading == pytest.approx(-0.4871, abs=1e-4)
    # Ties take WeightedCorr's weighted mid-rank; with power 0 that is scipy's Spearman with ties.
    from scipy.stats import spearmanr

    tied_s, tied_a = [1, 1, 2, 3, 3, 3], [1, 2, 2, 3, 5, 4]
    assert sel.weighted_spearman(tied_s, tied_a, 0.0) == pytest.approx(spearmanr(tied_s, tied_a).statistic)
    # A NaN or infinite score counts as the lowest finite one (the reference's set_nan_inf_to_min).
    assert sel.weighted_spearman([4, float("nan"), 2, 3], [1, 2, 3, 4]) == pytest.approx(
        sel.weighted_spearman([4, 2, 2, 3], [1, 2, 3, 4])
    )
    assert math.isnan(sel.weighted_spearman([1, 1, 1], [1, 2, 3]))  # a constant score: undefined
    ((key, rows),) = sel.rank_validators(sweep)
    by = {r["validator"]: r for r in rows}
    assert set(by) == {"source_val", "im"}
    # regret of source_val: seed 1 best test 60, chosen 50 -> 10; seed 2: 61 - 51 -> 10
    assert by["source_val"]["regret"] == pytest.approx(10.0)
    assert by["im"]["regret"] == pytest.approx(20.0)  # chose 40 (41)
    assert by["source_val"]["checkpoints"] == 12


def test_the_validators_figure(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    from dael_plugin.tools import plots

    assert plots.main([sweep, "--out", str(tmp_path / "figs"), "--only", "validators"]) == 0
    assert os.path.getsize(tmp_path / "figs" / "validators.png") > 1000


def test_a_cell_with_another_seed_count_says_so():
    assert sel.CellChoice([1.0, 2.0, 3.0]).text(2) == "2.00 ± 1.00 [0.58] (n=3)"
    assert sel.CellChoice([1.0, 2.0, 3.0]).text(3) == "2.00 ± 1.00 [0.58]"


def test_ties_go_to_the_earliest_epoch_then_the_first_setting(tmp_path):
    root = str(tmp_path / "ties")
    for setting in ("b", "a"):
        _run(root, setting, "t", 1, [_ep(1, 40, 50), _ep(2, 60, 50)])
    (choice,) = _cell(root, "source_val")["DAEL"]["t"].choices.values()
    assert (choice.setting, choice.epoch, choice.test) == ("DAEL/a", 1, 40.0)


def test_records_without_a_source_split_say_why_source_val_has_no_score(tmp_path):
    """Runs with EVAL_FREQ auto (no held-out source images) have records but no source_val score:
    the cell says so, with the fix, rather than 'no records'; a validator still chooses."""
    root = str(tmp_path / "auto")
    _run(root, "DAEL", "t", 1, [_ep(1, 40.0, tval=41.0, im=0.2), _ep(2, 50.0, tval=52.0, im=0.1)])
    text = sel.render_selected(sel.select(root, "source_val"), "source_val")
    assert "| DAEL | no score in the records | — |" in text and "rerun them with SELECTION.EVAL_FREQ 1" in text
    cell = sel.select(root, "im")[0][2]["DAEL"]["t"]
    assert cell.values == [40.0] and cell.choices[1].epoch == 1
    assert "No score" not in sel.render_selected(sel.select(root, "im"), "im")


def test_a_folder_of_both_engines_gives_a_row_per_engine(tmp_path):
    """Two sweeps, one per engine, under one folder: plain collect shows a row per engine, and so
    does --select (it refused before: "two records for ... keep one"). No cell mixes the engines."""
    root = str(tmp_path / "mix")
    for engine, base in (("builtin", 40.0), ("dassl", 60.0)):
        for seed in (1, 2):
            d = _run(
                os.path.join(root, engine), "lam=1", "t", seed, [_ep(1, base + seed, 50), _ep(2, base + 10 + seed, 70)]
            )
            with open(os.path.join(d, "results.json")) as f:
                rec = json.load(f)
            rec["engine"] = engine
            with open(os.path.join(d, "results.json"), "w") as f:
                json.dump(rec, f)
    cells = _cell(root, "source_val")
    assert sorted(cells) == ["DAEL [engine=builtin]", "DAEL [engine=dassl]"]
    assert cells["DAEL [engine=builtin]"]["t"].values == [51.0, 52.0]
    assert cells["DAEL [engine=dassl]"]["t"].values == [71.0, 72.0]
    per = _cell(root, "source_val", per_setting=True)  # rows named as plain collect names them
    assert sorted(per) == ["DAEL [engine=builtin]", "DAEL [engine=dassl]"]


def test_runs_of_one_seed_in_other_settings_outside_the_sweep_layout_are_settings_to_choose_from(tmp_path):
    """Two runs of one trainer, target and seed in folders of the user's own (not a sweep's
    layout), in other settings: plain collect shows a row per setting, and --select chooses
    between the two as between a sweep's grid settings (it refused: "two records ... keep one")."""
    root = str(tmp_path / "own")
    for name, lr, test in (("a", 0.1, 40.0), ("b", 0.2, 60.0)):
        d = os.path.join(root, name)
        os.makedirs(d)
        rec = {"accuracy": test, "target_domains": ["t"], "source_domains": ["a", "b"], "dataset": "Set"}
        rec.update(trainer="DAEL", seed=1, setting="DA", epochs=1, engine="builtin")
        with open(os.path.join(d, "results.json"), "w") as f:
            json.dump(dict(rec, provenance={"config": f"OPTIM:\n  LR: {lr}\n"}), f)
        with open(os.path.join(d, "epochs.jsonl"), "w") as f:
            f.write(json.dumps(_ep(1, test, src=100 - test)) + "\n")
    rows = {row for table in collect.read_runs(root).values() for row in table}
    assert rows == {"DAEL [LR=0.1]", "DAEL [LR=0.2]"}
    cell = _cell(root, "source_val")["DAEL"]["t"]
    assert cell.values == [40.0] and {c.setting for c in cell.choices.values()} == {"DAEL [LR=0.1]"}
    assert sorted(_cell(root, "source_val", per_setting=True)) == sorted(rows)


def test_validators_with_every_record_refused_name_the_runs_and_lines(tmp_path, capsys):
    """Every run's records numbered past the run's epochs: ``--validators`` names the refused runs
    and the reason, not the setting (SELECTION.EVAL_FREQ) the user already has; runs without any
    records are sent to that setting; and a folder of DG runs alone says so."""
    from dael_plugin.tools import collect

    root = str(tmp_path / "past")
    for seed in (1, 2):
        d = _run(root, "base", "t", seed, [_ep(1, 40, im=0.1), _ep(2, 50, im=0.2), _ep(3, 45, im=0.3)])
        rec = json.load(open(os.path.join(d, "results.json")))
        rec["epochs"] = 2  # the records go to epoch 3
        json.dump(rec, open(os.path.join(d, "results.json"), "w"))
    assert collect.main([root, "--validators"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "epoch records of 2 of its 2 DA run(s) were refused" in err and "seed1" in err
    assert "epoch 3 is past the run's 2" in err and "EVAL_FREQ" not in err

    bare = str(tmp_path / "bare")
    d = _run(bare, "base", "t", 1, [_ep(3, 45)])
    os.remove(os.path.join(d, "epochs.jsonl"))
    assert collect.main([bare, "--validators"]) == 2
    assert "has epoch records: train with SELECTION.EVAL_FREQ" in capsys.readouterr().err

    dg = str(tmp_path / "dg")
    _run(dg, "base", "t", 1, [_ep(1, 40, im=0.1), _ep(2, 50, im=0.2)], table_setting="DG")
    assert collect.main([dg, "--validators"]) == 2
    assert f"no DA run under {dg}" in capsys.readouterr().err
