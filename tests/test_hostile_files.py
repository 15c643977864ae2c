"""Files that are not what their names say: a FIFO or a link to a device named like an image, a
folder named like an image, a FIFO named results.json. Opening a FIFO blocks until a writer comes,
so each is refused by its type before it is opened: a run and collect go on, naming it."""

import os
import shutil
import threading

import pytest

from dael_plugin.data.images import decode
from dael_plugin.engine.results_reader import read_records


def _returns_within(fn, seconds=10):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 (the test inspects it)
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)  # a blocked open() would keep it forever
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked (opening a FIFO waits for a writer)"
    return box


@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link", "folder"])
def test_an_image_path_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path, kind):
    path = tmp_path / "zz.png"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero_link":
        os.symlink("/dev/zero", path)
    else:
        path.mkdir()
    box = _returns_within(lambda: decode(str(path)))
    assert isinstance(box.get("error"), OSError) and "not a regular file" in str(box["error"])


def test_a_fifo_among_the_training_images_is_replaced_and_the_run_finishes(tmp_path, tiny_root, capsys):
    from test_hardening import args_for, cli

    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root)
    os.mkfifo(os.path.join(root, "embedded_digits", "hand", "train", "3", "zz.png"))
    box = _returns_within(lambda: cli(args_for(root, tmp_path / "run", epochs=1), capsys), seconds=240)
    code, out, _ = box["value"]
    assert code == 0 and "zz.png" in out
    assert (tmp_path / "run" / "results.json").exists()


def test_collect_lists_a_fifo_named_results_json_as_a_problem(tmp_path):
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "results.json")
    box = _returns_within(lambda: read_records(str(tmp_path)))
    walk = box["value"]
    assert not walk.records and [p.why for p in walk.problems] == ["not a regular file"]


def test_a_tilde_in_every_path_flag_is_the_home_folder(tmp_path, tiny_root, capsys, monkeypatch):
    """``--output-dir '~/x'`` (quoted, so no shell expanded it) writes under $HOME, as ``--root`` reads
    from it: no folder named ``~`` appears in the current directory."""
    from test_hardening import args_for, cli

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    shutil.copytree(tiny_root, home / "data")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    code, _, err = cli(args_for("~/data", "~/run", epochs=1), capsys)
    assert code == 0, err[-2000:]
    assert (home / "run" / "results.json").exists() and os.listdir(cwd) == []


def test_a_source_model_file_of_the_wrong_kind_is_one_line_on_both_engines_loader(tmp_path):
    """``MODEL.INIT_WEIGHTS`` has one loader on both engines (engine/source_model.py): Dassl's
    names or the built-in engine's converted to them, a misfit named by its first key, a value
    that is not a tensor named by its type, and a good file loaded key for key."""
    import torch
    from torch import nn

    from dael_plugin.engine.checkpoint import CheckpointError
    from dael_plugin.engine.source_model import load_source_model

    model = nn.ModuleDict({"backbone": nn.Linear(3, 4), "classifier": nn.Linear(4, 2)})
    good = {"F.weight": torch.ones(4, 3), "F.bias": torch.zeros(4), "C.weight": torch.full((2, 4), 2.0)}
    cases = {
        "no classifier.bias": {"model": good},
        "classifier.bias is int": {"state_dict": {**model.state_dict(), "classifier.bias": 3}},
        "1 keys this model lacks (critic.weight": {
            "state_dict": {**model.state_dict(), "critic.weight": torch.ones(1)}
        },
        "holds no model weights": {"state_dict": [1, 2]},
    }
    for said, state in cases.items():
        path = tmp_path / "m.pth.tar"
        torch.save(state, path)
        with pytest.raises(CheckpointError, match="MODEL.INIT_WEIGHTS .*") as err:
            load_source_model(str(path), model)
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    torch.save({"model": {**good, "C.bias": torch.ones(2), "D.weight": torch.ones(1)}}, path)
    load_source_model(str(path), model)  # the built-in engine's names; its critic (D.*) is not the source model's
    assert torch.equal(model["backbone"].weight, good["F.weight"]) and torch.equal(
        model["classifier"].bias, torch.ones(2)
    )
    torch.save({"state_dict": {"module." + k: v + 1 for k, v in model.state_dict().items()}}, path)
    load_source_model(str(path), model)  # Dassl's, under DataParallel's prefix
    assert torch.equal(model["classifier"].bias, torch.full((2,), 2.0))
