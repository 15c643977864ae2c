"""A resume onto other data is one line, on both engines: a class folder renamed, added or removed
between a killed run and its resume would silently give labels another meaning (label i is the
i-th class folder in sorted order), and images added or removed change every later draw."""

import os
import shutil

import pytest
from test_gpu_stand_ins import _cfg


def _copy(tiny_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root)
    return root


def _rename_class(root, old, new):
    base = os.path.join(root, "embedded_digits")
    for domain in os.listdir(base):
        for split in ("train", "test"):
            folder = os.path.join(base, domain, split)
            if os.path.isdir(os.path.join(folder, old)):
                os.rename(os.path.join(folder, old), os.path.join(folder, new))


def _add_image(root, domain="hand", cls="3"):
    folder = os.path.join(root, "embedded_digits", domain, "train", cls)
    first = sorted(os.listdir(folder))[0]
    shutil.copy(os.path.join(folder, first), os.path.join(folder, "zz_added.png"))


def _builtin(out, root):
    from dael_plugin.engine.trainer import set_random_seed
    from dael_plugin.methods import build_trainer

    set_random_seed(1)
    return build_trainer(_cfg(out, root, "builtin"))


def _dassl(out, root):
    from dael_plugin.dassl_adapter import DAELTrainer

    return DAELTrainer(_cfg(out, root, "dassl"))


def _resume(engine, trainer, out):
    return trainer.resume_if_exists() if engine == "builtin" else trainer.resume_model_if_exist(str(out))


# "add" goes through the fingerprint's line on both engines; "relabel" (counts unchanged, only the
# fingerprint sees it) adds nothing engine-specific, so it runs on the built-in engine alone.
@pytest.mark.parametrize(
    "engine,change",
    [
        ("builtin", "rename"),
        ("builtin", "add"),
        ("builtin", "relabel"),
        pytest.param("dassl", "rename", marks=pytest.mark.dassl),
        pytest.param("dassl", "add", marks=pytest.mark.dassl),
    ],
)
def test_a_resume_onto_changed_data_is_one_line(tmp_path, tiny_root, engine, change):
    from dael_plugin.engine.checkpoint import CheckpointError

    if engine == "dassl":
        pytest.importorskip("dassl")
    build = _builtin if engine == "builtin" else _dassl
    root, out = _copy(tiny_root, tmp_path), tmp_path / "run"
    build(out, root).train()
    assert _resume(engine, build(out, root), out) == 1  # the same data: resumes
    if change == "rename":
        _rename_class(root, "0", "zero")  # sorted: '1' ... '9', 'zero': label 0 would now be '1'
        match = r"class folders gone: '0'; new: 'zero'"
    elif change == "add":
        _add_image(root)
        match = (
            r"images changed since .* \(train_x/hand: 61 images \(sha256 \w{12}\) where the checkpoint's run read 60 "
        )
    else:  # the same counts everywhere: only the fingerprint sees it
        folder = os.path.join(root, "embedded_digits", "street", "train")
        name = sorted(os.listdir(os.path.join(folder, "3")))[0]
        os.rename(os.path.join(folder, "3", name), os.path.join(folder, "4", name))
        match = r"\(train_x/street: 60 images \(sha256 \w{12}\) where the checkpoint's run read 60 \(sha256 \w{12}\)\)"
    with pytest.raises(CheckpointError, match=match) as err:
        _resume(engine, build(out, root), out)
    assert "\n" not in str(err.value) and "--output-dir" in str(err.value)
    from dael_plugin.engine.checkpoint import accept_data_change

    accept_data_change(True)  # --accept-data-change: changed images go on (a warning); changed classes never
    try:
        if change == "rename":
            with pytest.raises(CheckpointError, match=match):
                _resume(engine, build(out, root), out)
        else:
            assert _resume(engine, build(out, root), out) == 1
            from dael_plugin.engine import results
            from dael_plugin.engine.checkpoint import check_same_data, data_changes

            # the mark: in results.json, and in every later checkpoint, read back by a later resume
            (mark,) = data_changes()
            assert mark["resumed_at_epoch"] == 1 and "train_x/" in mark["changes"][0]
            # what results.json holds: results_record writes it on both engines (an eval-only record has none)
            cfg = _cfg(out, root, engine)
            assert results.results_record(cfg, engine, 50.0)["data_changes"] == [mark]
            assert results.results_record(cfg, engine, 50.0, model_dir=str(tmp_path))["data_changes"] == []
            check_same_data({"data_changes": [mark]}, "later.pth.tar", None, None, None)  # no change since
            assert data_changes() == [mark]
    finally:
        accept_data_change(False)
