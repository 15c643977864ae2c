"""engine/loop.py: the epoch both engines run, written once."""

import pytest
import torch

from dael_plugin.engine.guard import FiniteGuard
from dael_plugin.engine.loop import pick_eval_split, train_epoch


def _epoch(n, freq, bad_at=None):
    seen, guard = [], FiniteGuard()

    def step(batch_x, _batch_u):
        loss = torch.tensor(float("nan") if batch_x["i"] == bad_at else float(batch_x["i"]))
        guard.update(loss)
        return {"loss": loss}

    def report(i, meters):
        seen.append((i, meters.means()["loss"]))

    batches = (({"i": i}, None) for i in range(n))
    meters = train_epoch(batches, n, step, guard, freq, report, lambda done: RuntimeError(f"diverged at {done}"))
    return seen, meters


def test_the_host_reads_every_print_freq_batches_and_at_the_end():
    seen, meters = _epoch(5, 2)
    assert [i for i, _ in seen] == [1, 3, 4]
    assert [m for _, m in seen] == [0.5, 1.5, 2.0]  # running means of 0, 1, 2, 3, 4
    assert meters.count == 5


def test_a_short_epoch_is_read_at_every_batch():
    seen, _ = _epoch(3, 10)
    assert [i for i, _ in seen] == [0, 1, 2]


def test_a_non_finite_loss_stops_at_the_next_read_with_the_batches_done():
    with pytest.raises(RuntimeError, match="diverged at 4"):
        _epoch(8, 4, bad_at=2)


def test_eval_loader_takes_val_where_there_is_one(capsys):
    assert pick_eval_split("val", "V", "T") == ("val", "V")
    assert pick_eval_split("test", "V", "T") == ("test", "T")
    assert pick_eval_split("val", None, "T") == ("test", "T")
    assert "no validation split" in capsys.readouterr().out


def test_the_example_trainer_in_the_docs_trains(tmp_path, tiny_root):
    """docs/internals.md's example trainer, run as the page shows it: registered by its decorator,
    trained through the CLI's main() for two epochs on the embedded set (DA: the target batches
    reach its update), evaluated, and written to results.json like any built-in trainer."""
    import json
    import os
    import re

    from conftest import ROOT, run_here
    from dael_plugin.methods import TRAINERS

    text = open(os.path.join(ROOT, "docs", "internals.md")).read()
    block = re.search(r"```python\n(.*?)```", text[text.index("## A trainer of your own") :], re.S).group(1)
    assert len(block.splitlines()) <= 35
    scope: dict = {}
    try:
        exec(compile(block, "docs/internals.md", "exec"), scope)
        cls = TRAINERS["EntMin"]
        seen = []
        real = cls.update
        cls.update = lambda self, bx, bu: (seen.append(bu is not None), real(self, bx, bu))[1]
        out = tmp_path / "out"
        proc = run_here(
            ["--engine", "builtin", "--trainer", "EntMin", "--root", tiny_root, "--output-dir", str(out),
             "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
             "--config-file", os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
             "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
             "DATALOADER.NUM_WORKERS", "0", "OPTIM.MAX_EPOCH", "2", "SELECTION.EVAL_FREQ", "0"],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert seen and all(seen), seen  # every update had a target batch
        assert "loss_u" in proc.stdout
        record = json.loads((out / "results.json").read_text())
        assert record["trainer"] == "EntMin" and record["setting"] == "DA"
        assert 0 <= record["accuracy"] <= 100
        with pytest.raises(Exception, match="exists"):  # a name taken is refused
            from dael_plugin.methods import register

            register("EntMin")(type("Other", (cls,), {}))
    finally:
        TRAINERS.pop("EntMin", None)
