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
