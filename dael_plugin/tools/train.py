"""``scripts/train.py``: Dassl's train CLI, on Dassl or on the built-in engine.

The flags are those of Dassl's ``tools/train.py``, plus ``--engine``. This module is the run's
sequence and its one place that turns a stop into an exit status; each job lives in a room of its
own beside it:

- ``train_cli``: the command line and the checks on the parsed flags;
- ``train_config``: the config, assembled as Dassl does (defaults -> ``add_dael_config`` ->
  dataset config file -> method config file -> flags -> trailing ``KEY VALUE`` opts ->
  ``clean_cfg``), and its checks;
- ``train_outdir``: the output folder's identity (writable, finished runs, the data fingerprint);
- ``train_engines``: the Dassl run, the log's config block, the weights ``--eval-only`` reads;
- ``train_stops``: SIGTERM, out of memory and a lost peer, each one line and an exit status.
"""

from __future__ import annotations

if __name__ == "__main__":  # a process of its own: torch's imports with the GC paused (startup.py)
    from dael_plugin import startup

    startup.pause_for_imports()

import argparse
import os
import signal
import sys
import threading
import time
from typing import List, Optional

from dael_plugin.config.keys import loader_bytes
from dael_plugin.data.fingerprint import one_digest
from dael_plugin.engine import distributed
from dael_plugin.engine.atomic import remove_stale_temps
from dael_plugin.engine.checkpoint import accept_data_change
from dael_plugin.engine.memory import cap_host_memory, is_host_oom, restore_host_memory
from dael_plugin.engine.results import (
    Evaluation,
    remove_failure,
    results_record,
    write_failure,
    write_results,
)
from dael_plugin.engine.runlock import BusyError, ClashError, RunLock
from dael_plugin.errors import EXIT_BUSY, EXIT_CLASH, DAELConfigError, NonFiniteLossError, Terminated, say
from dael_plugin.tools.plugins import load_plugins
from dael_plugin.tools.train_cli import (
    build_parser,
    check_select,
    choose_engine,
    expand_user,
)
from dael_plugin.tools.train_config import (
    check_names_and_files,
    plugin_method_on_dassl,
    settings_digest,
    setup_cfg,
)
from dael_plugin.tools.train_engines import (
    load_for_eval,
    run_dassl,
    run_setting,
    say_config,
    say_threads,
    train_dassl,
)
from dael_plugin.tools.train_outdir import finished_run, prepare_output_dir, run_fingerprint
from dael_plugin.tools.train_stops import (
    EXIT_LOST_PEER,
    oom_exit,
    oom_types,
    raise_terminated,
    record_config_error,
    redeliver_swallowed_stops,
    say_on_rank0,
    stop_listening,
    torch_distributed,
    where_to_resume,
    worker_terminated,
)


def check_torchrun_trainer(cfg, engine: str) -> None:
    """Under torchrun (or before a sweep launches a run of N processes), one line where the trainer
    runs on one process only, before any process joins the group: Dassl's own trainers (Dassl has no
    multi-process training), and the methods whose updates cannot be right under DDP (the built-in
    M3SDA, ...: ``refuse_under_torchrun``), on either engine."""
    name = str(cfg.TRAINER.NAME)
    on_loop = engine == "dassl" and plugin_method_on_dassl(name)
    if engine == "dassl" and name not in ("DAEL", "DAELDG") and not on_loop:
        raise DAELConfigError(
            f"Dassl's {name} trainer runs on one process only (Dassl has no multi-process training); run "
            "it without torchrun, or, for SourceOnly, with --engine builtin"
        )
    if engine == "builtin" or on_loop:
        from dael_plugin.methods import trainer_class

        trainer_class(name).refuse_under_torchrun(name)  # Dassl's baselines: one process


def main(argv: Optional[List[str]] = None) -> int:
    from dael_plugin.engine.runlog import close_logger
    from dael_plugin.startup import resume_after_imports

    resume_after_imports()  # where this process paused the GC for its imports

    args = build_parser().parse_args(argv)
    expand_user(args)
    distributed.quiet_unless_main()  # under torchrun, one process speaks on stdout
    state: dict = {}
    # SIGTERM (scancel, preemption, most schedulers, a sweep that ends) stops the run as Ctrl-C does.
    previous = (
        signal.signal(signal.SIGTERM, raise_terminated)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    previous_hook = sys.unraisablehook
    if previous is not None:  # a stop raised inside a finalizer is not lost (train_stops)
        sys.unraisablehook = redeliver_swallowed_stops
    previous_int = None
    if previous is not None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with SIGINT ignored (a background job of a script, a pytest-xdist worker's child):
        # Python then leaves it ignored, and the sweep's clean stop (SIGINT) would do nothing.
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    sigchld = signal.getsignal(signal.SIGCHLD) if previous is not None else None

    def terminated() -> int:
        if previous is not None:
            stop_listening(sigchld)
        if distributed.world().is_main:  # torchrun stops every rank: one of them says so
            say(f"terminated (SIGTERM): {where_to_resume(state.get('output_dir'), args.eval_only)}")
        return 143

    try:
        return _main(args, state)
    except Terminated:
        return terminated()
    except ClashError as exc:
        say(f"error: {exc}")
        return EXIT_CLASH
    except BusyError as exc:
        say(f"error: {exc}")
        return EXIT_BUSY
    except DAELConfigError as exc:
        # Under torchrun every rank reads the same command line and data and stops at the same
        # line: rank 0 says it, once. The others wait for torchrun to stop them after rank 0's exit
        # (an early exit of theirs would have torchrun stop rank 0 before it speaks).
        record_config_error(args, state, str(exc))
        say_on_rank0(distributed.from_env().rank, str(exc))
        return 2
    except NonFiniteLossError as exc:  # every rank stops at the same read; rank 0 records and says it
        if distributed.world().is_main and state.get("output_dir"):
            write_failure(state["output_dir"], str(exc))
        say_on_rank0(distributed.world().rank, str(exc))  # the others wait: the record is written first
        return 3
    except KeyboardInterrupt:
        if distributed.world().is_main:
            say(f"interrupted: {where_to_resume(state.get('output_dir'), args.eval_only)}")
        return 130
    except oom_types() as exc:
        return oom_exit(exc, state)
    except (RuntimeError, getattr(torch_distributed(), "DistError", RuntimeError)) as exc:
        if is_host_oom(exc):  # torch's CPU allocator raises a plain RuntimeError
            return oom_exit(exc, state)
        if worker_terminated(exc):
            return terminated()
        if not distributed.lost_peer(exc):
            raise
        # Rank 0 says it, once: another rank that lost rank 0 (which stopped with its own line, or
        # died, which torchrun's report names) stays silent rather than add a second, wrong cause.
        if distributed.world().is_main:
            say(f"error: {distributed.lost_peer_line(exc)}")
        return EXIT_LOST_PEER
    finally:
        if state.get("trainer") is not None:  # its loaders' workers, now, not at a later garbage collection
            from dael_plugin.data.batching import release_loaders

            release_loaders(state.pop("trainer"))
        restore_host_memory(state.pop("memory_cap", None))  # in-process callers (tests) get theirs back
        if state.get("lock") is not None:
            state["lock"].release()
        close_logger()
        distributed.finish()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            sys.unraisablehook = previous_hook
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _main(args: argparse.Namespace, state: dict) -> int:
    engine = choose_engine(args.engine)
    if args.eval_each_epoch and engine != "builtin":
        raise DAELConfigError("--eval-each-epoch is a built-in engine flag; with Dassl, look at the final test")
    if args.eval_only and not args.model_dir:
        raise DAELConfigError(
            "--eval-only needs --model-dir <OUTPUT_DIR of a run>; it never reads the current directory"
        )
    if args.select:
        check_select(args)
    if engine == "dassl":
        import dael_plugin  # noqa: F401  (registers the trainer, datasets and backbones)
    load_plugins(args.plugin)  # trainers of the user's own, before any name is checked
    if args.hash_pixels and not args.check_data:
        raise DAELConfigError("--hash-pixels goes with --check-data (it hashes the bytes that check reads)")
    accept_data_change(args.accept_data_change)
    said: List[str] = []  # SEED -1's line, once the names are checked too
    cfg = setup_cfg(args, engine, said)
    check_names_and_files(cfg, engine)  # before the output folder, the log and the config dump
    if distributed.from_env().distributed:
        check_torchrun_trainer(cfg, engine)
    for line in said:
        print(line)
    w = distributed.init(cfg.USE_CUDA)  # under torchrun: join the run's processes (rank 0 writes)
    state["output_dir"] = cfg.OUTPUT_DIR
    state["cfg"] = cfg
    import torch

    if not (cfg.USE_CUDA and torch.cuda.is_available()):  # a GPU run's out-of-memory is already one line
        state["memory_cap"] = cap_host_memory(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), loader_bytes(cfg))
    finished = False
    if w.is_main:
        prepare_output_dir(cfg.OUTPUT_DIR)
        state["lock"] = RunLock(cfg.OUTPUT_DIR, settings=settings_digest(cfg)).acquire()
        for path in remove_stale_temps(cfg.OUTPUT_DIR):
            print(f"dael_plugin: removed {path}, left by a write that was killed")
        finished = not args.eval_only and not args.no_train and finished_run(cfg, args, engine)
    if distributed.from_main(finished):
        return 0
    start = time.time()
    if engine == "dassl":
        run = run_dassl(cfg, args)
        trainer, recorded = run["trainer"], run["recorded"]
    else:
        from dael_plugin.engine.runlog import setup_logger
        from dael_plugin.engine.trainer import set_random_seed
        from dael_plugin.methods import build_trainer

        if cfg.SEED >= 0:
            print(f"Setting fixed seed: {cfg.SEED}")
            set_random_seed(cfg.SEED)
        if w.is_main:
            setup_logger(cfg.OUTPUT_DIR)
        say_threads()
        say_config(cfg)
        trainer = build_trainer(cfg, eval_each_epoch=args.eval_each_epoch, eval_only=args.eval_only)
        recorded = {}
    state["trainer"] = trainer
    distributed.seed_ranks(cfg.SEED)
    pixels = None
    if args.check_data:
        from dael_plugin.data.check import check_trainer_data

        pixels = check_trainer_data(trainer, engine, cfg.DATALOADER.NUM_WORKERS, args.hash_pixels)
    epochs = None
    if args.eval_only:
        epochs = load_for_eval(trainer, engine, args)
        acc = trainer.test()
        recorded["accuracy"] = acc
    elif not args.no_train:
        if w.is_main:
            remove_failure(cfg.OUTPUT_DIR)
        if engine == "dassl":
            train_dassl(trainer, cfg)
        else:
            trainer.train()
        if engine == "builtin" and not cfg.TEST.NO_TEST:
            recorded["accuracy"] = trainer.last_accuracy
    else:
        return 0
    if not w.is_main:
        return 0
    record = results_record(
        cfg,
        engine,
        recorded.get("accuracy"),
        Evaluation.of(trainer),
        run_setting(trainer),
        wall_seconds=time.time() - start,
        epochs=epochs,
        model_dir=os.path.abspath(args.model_dir) if args.eval_only else None,
    )
    record["data"] = run_fingerprint(trainer, cfg)
    record["data_digest"] = one_digest(record["data"])
    if pixels is not None:
        record["data_pixels_sha256"] = pixels
    if args.eval_only and args.select:  # the model a protocol chose, and at which epoch
        record["selected_by"] = {"protocol": args.select, "epoch": epochs}
    if trainer.source_val_info is not None:  # the records' source validation split
        record["source_val_split"] = trainer.source_val_info
    if not args.eval_only:  # the first-step check of the fused pass (CUDA), where this process ran one
        record["fast_path_check"] = trainer.fast_path_check
    path = write_results(cfg.OUTPUT_DIR, record, name="results_eval.json" if args.eval_only else "results.json")
    print(f"dael_plugin: wrote {path}")
    return 0


if __name__ == "__main__":  # python -m dael_plugin.tools.train (what sweeps run)
    sys.exit(main())
