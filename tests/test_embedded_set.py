"""The embedded set's first use: many runs at once on a fresh --root (a sweep), a folder of that
name that is not this version's set, a generation killed half-way, and a root that cannot be written."""

import os
import threading
import time

import pytest

from dael_plugin.data import embedded
from dael_plugin.errors import DAELConfigError


def _fake_generate(calls, started=None, go=None):
    def generate(out_dir, seed=0):
        calls.append(out_dir)
        if started is not None:
            started.set()
            go.wait(10)
        os.makedirs(os.path.join(out_dir, "hand", "train", "0"))
        open(os.path.join(out_dir, "hand", "train", "0", "00000.png"), "wb").close()
        return {}

    return generate


def test_runs_starting_together_generate_once_and_never_delete_a_set_in_use(tmp_path, monkeypatch):
    """The second run waits on the kernel's lock while the first generates, then reads that set: one
    generation, nothing deleted (the old code generated twice and removed the first set under its readers)."""
    calls, started, go = [], threading.Event(), threading.Event()
    monkeypatch.setattr(embedded, "generate", _fake_generate(calls, started, go))
    results = {}
    first = threading.Thread(target=lambda: results.update(a=embedded.ensure_embedded(str(tmp_path))))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: results.update(b=embedded.ensure_embedded(str(tmp_path))))
    second.start()
    time.sleep(0.5)
    assert second.is_alive(), "the second run did not wait for the first's generation"
    go.set()
    first.join(10), second.join(10)
    assert len(calls) == 1 and results["a"] == results["b"]
    assert sorted(os.listdir(tmp_path)) == [".embedded_digits.lock", "embedded_digits"]


def test_a_folder_that_is_not_this_versions_set_is_never_overwritten(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "generate", _fake_generate([]))
    mine = tmp_path / "embedded_digits" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("a user's file")
    with pytest.raises(DAELConfigError, match="not the embedded set this version makes.*no VERSION file"):
        embedded.ensure_embedded(str(tmp_path))
    (tmp_path / "embedded_digits" / "VERSION").write_text("embedded-digits-v1 seed=0\n")
    with pytest.raises(DAELConfigError, match="VERSION says 'embedded-digits-v1 seed=0'"):
        embedded.ensure_embedded(str(tmp_path))
    assert mine.read_text() == "a user's file"


def test_a_killed_generation_is_cleaned_and_the_set_is_readable_by_all(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "generate", _fake_generate([]))
    (tmp_path / ".embedded_digits-abc123" / "hand").mkdir(parents=True)  # left by kill -9 mid-generation
    target = embedded.ensure_embedded(str(tmp_path))
    assert not (tmp_path / ".embedded_digits-abc123").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(target).st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private 0700


def test_a_root_that_cannot_be_written_is_one_line(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(DAELConfigError, match="cannot write the embedded set under .*pass a writable --root"):
        embedded.ensure_embedded(str(not_a_dir / "root"))


def test_a_root_without_the_set_is_said_once_with_its_path(tmp_path, monkeypatch, capsys):
    """A typo in --root would build a second 20 MB set quietly: the first use says where, once."""
    monkeypatch.setattr(embedded, "generate", _fake_generate([]))
    embedded.ensure_embedded(str(tmp_path / "typo"))
    embedded.ensure_embedded(str(tmp_path / "typo"))
    err = capsys.readouterr().err
    assert err.count("no embedded set under") == 1 and str(tmp_path / "typo") in err
