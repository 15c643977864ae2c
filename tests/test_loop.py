"""engine/loop.py: the epoch both engines run, written once."""

import pytest
import torch

from dael_plugin.engine.guard import FiniteGuard
from dael_plugin.engine.loop import eval_loader, train_epoch


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
    assert eval_loader("val", "V", "T") == ("val", "V")
    assert eval_loader("test", "V", "T") == ("test", "T")
    assert eval_loader("val", None, "T") == ("test", "T")
    assert "no validation split" in capsys.readouterr().out
