"""engine/loop.py: the epoch both engines run, written once."""

import pytest
import torch

from dael_plugin.engine.guard import FiniteGuard
from dael_plugin.engine.loop import epoch_batches, pick_eval_split, train_epoch


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


class _Loader:
    """A loader of ``n`` batches; each pass is numbered (``(pass, i)``), as a fresh draw would be."""

    def __init__(self, n):
        self.n, self.passes, self.batch_sampler = n, 0, self
        self.epoch = None

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        self.passes += 1
        return iter([(self.passes, i) for i in range(self.n)])


@pytest.mark.parametrize(
    "count, n, x_seen, u_seen",
    [
        ("train_x", 3, [(1, 0), (1, 1), (1, 2)], [(1, 0), (1, 1), (1, 2)]),
        ("train_u", 5, [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)], [(1, i) for i in range(5)]),
        ("smaller_one", 3, [(1, 0), (1, 1), (1, 2)], [(1, 0), (1, 1), (1, 2)]),
    ],
)
def test_an_epoch_has_as_many_batches_as_dassls_count_iter_says(count, n, x_seen, u_seen):
    """Dassl's ``TrainerXU.run_epoch``, hand-worked for 3 source batches and 5 target ones: under
    ``train_u`` the source loader runs out after 3 and starts a second pass (fresh draws)."""
    x, u = _Loader(3), _Loader(5)
    length, pairs = epoch_batches((x, u), 7, count)
    pairs = list(pairs)
    assert length == len(pairs) == n and x.epoch == u.epoch == 7
    assert [b for b, _ in pairs] == x_seen and [b for _, b in pairs] == u_seen


def test_a_dg_epoch_is_the_source_loaders_whatever_count_iter_says():
    x = _Loader(3)
    length, pairs = epoch_batches((x, None), 0, "train_u")
    assert length == 3 and [u for _, u in pairs] == [None] * 3


def test_a_count_iter_dassl_lacks_is_one_line_not_the_source_loaders_epoch():
    """Dassl's TrainerXU raises on any other value; a silent fallback would run another epoch."""
    from dael_plugin.errors import DAELConfigError

    with pytest.raises(DAELConfigError, match="TRAIN.COUNT_ITER='train_uu': an epoch counts"):
        epoch_batches((_Loader(3), _Loader(5)), 0, "train_uu")


def test_the_built_in_engine_counts_its_epoch_by_count_iter(tmp_path, tiny_root):
    """On the built-in engine ``TRAIN.COUNT_ITER train_u`` makes DAEL's epoch as long as its target
    loader, and the source loader's second pass draws batches of its own (it was refused here)."""
    from test_contract import build

    tr = build("DAEL", tiny_root, tmp_path / "run", None, None, "TRAIN.COUNT_ITER", "train_u",
               "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "3")  # fmt: skip
    nx, nu = len(tr.train_loader_x), len(tr.train_loader_u)
    assert nu > nx
    paths = [tuple(bx["index"].tolist()) for bx, _ in tr._batches()]
    assert tr.num_batches == len(paths) == nu
    assert paths[nx] != paths[0] and len(set(paths)) == len(paths)


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
        cls = TRAINERS["JointEntMin"]
        seen = []
        real = cls.update
        cls.update = lambda self, bx, bu: (seen.append(bu is not None), real(self, bx, bu))[1]
        out = tmp_path / "out"
        proc = run_here(
            ["--engine", "builtin", "--trainer", "JointEntMin", "--root", tiny_root, "--output-dir", str(out),
             "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
             "--config-file", os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
             "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
             "DATALOADER.NUM_WORKERS", "0", "OPTIM.MAX_EPOCH", "2", "SELECTION.EVAL_FREQ", "0"],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert seen and all(seen), seen  # every update had a target batch
        assert "loss_u" in proc.stdout
        record = json.loads((out / "results.json").read_text())
        assert record["trainer"] == "JointEntMin" and record["setting"] == "DA"
        assert 0 <= record["accuracy"] <= 100
        with pytest.raises(Exception, match="exists"):  # a name taken is refused
            from dael_plugin.methods import register

            register("JointEntMin")(type("Other", (cls,), {}))
    finally:
        TRAINERS.pop("JointEntMin", None)
