"""The embedded set with category shift, and the comparison on it (docs/category_shift.md).

    python scripts/category_shift.py [--root data] [--seeds 1 2 3] [--engine builtin] [--epochs 15]

Builds ``<root>/embedded_digits_cs/`` once: hard links (copies where the file system has none)
into the embedded set, in the layout of ``DATASET.NAME DomainFolders``, where each source domain
keeps a fixed subset of the ten digits and the target keeps all ten:

- ``hand``: 0 1 2 3 4 5;  ``street``: 3 4 5 6 7;  ``font``: 0 6 7 8 9;  target ``blend``: 0-9.

Digits 1 and 2 are held by ``hand`` alone and 8 and 9 by ``font`` alone; every other digit by two
sources. Then, for each seed, it trains SourceOnly, the paper's DAEL on the union of the classes
("naive") and DAEL with ``TRAINER.DAEL.CLASS_MASKS all`` (core/category_shift.py), all through
scripts/train.py with ``DATASET.CATEGORY_SHIFT True``, and prints the target test accuracy, overall
and on the digits one source alone holds. ``--ablations`` adds L_u's variants; ``--parts`` each
part of the design turned on alone; ``--rules`` the pseudo-labelling rules (``PSEUDO_LABEL agree``,
``corroborate``, ``U_BALANCE``). ``--split 2`` (or ``--split 1 2``) uses a second split with less
overlap (``embedded_digits_cs2``: hand 0-3, street 3-7, font 0 7-9). ``--records N`` writes records
every N epochs on a held-out part of the sources, and the table adds the epoch and the DAEL row
that source validation chooses, without target labels (and the oracle's choice, an upper bound).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from typing import Dict, List

from dael_plugin.engine.atomic import write_json
from dael_plugin.errors import DAELConfigError
from dael_plugin.tools.category_shift_table import (
    chosen_text,
    last_pseudo_labels,
    rule_choice,
    sd,
    single_source_accuracy,
)
from dael_plugin.tools.sweep_plan import settings_changes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The two splits (--split): which digits each source domain keeps; the target keeps all ten.
SPLITS = {
    1: {"hand": "012345", "street": "34567", "font": "06789"},
    # less overlap: 4-5 classes per source, each shared digit held by two sources, seven by one
    2: {"hand": "0123", "street": "34567", "font": "0789"},
}
SET_DIRS = {1: "embedded_digits_cs", 2: "embedded_digits_cs2"}
SOURCES = SPLITS[1]
TARGET = "blend"
DATASET_CFG = "configs/datasets/da/embedded_digits_cs.yaml"
IDENTITY = "category_shift_run.json"  # the settings a folder's run was launched with


def single_source_digits(sources: Dict[str, str]) -> List[str]:
    """The digits one source alone holds (split 1: 1 2 8 9)."""
    return [d for d in "0123456789" if sum(d in keep for keep in sources.values()) == 1]


_DAEL_CFG = "configs/trainers/da/dael/embedded_digits.yaml"
METHODS = {  # row: (trainer, config, extra options)
    "SourceOnly": ("SourceOnly", "configs/trainers/da/source_only/embedded_digits.yaml", []),
    "DAEL (naive: the union as one label set)": ("DAEL", _DAEL_CFG, []),
    "DAEL (CLASS_MASKS)": (
        "DAEL",
        _DAEL_CFG,
        ["TRAINER.DAEL.CLASS_MASKS", "all"],
    ),
}
# Ablations of the category-shift DAEL (--ablations): pseudo-labels from the per-class ensemble
# instead of the most confident expert, and no L_u at all.
ABLATIONS = {
    "DAEL (CLASS_MASKS, PSEUDO_LABEL ensemble)": (
        "DAEL",
        _DAEL_CFG,
        ["TRAINER.DAEL.CLASS_MASKS", "all", "TRAINER.DAEL.PSEUDO_LABEL", "ensemble"],
    ),
    "DAEL (CLASS_MASKS, no L_u)": (
        "DAEL",
        _DAEL_CFG,
        ["TRAINER.DAEL.CLASS_MASKS", "all", "TRAINER.DAEL.LOSSES", "ce_cr"],
    ),
    "DAEL (naive, no L_u)": ("DAEL", _DAEL_CFG, ["TRAINER.DAEL.LOSSES", "ce_cr"]),
}
# Each part of the design alone (--parts): the three that act without L_u, against "naive, no L_u",
# and the pseudo-labeller's part, with L_u, against naive DAEL; then "experts" with "ensemble";
# part "other" (the experts learn "not mine" instead of being masked) with and without L_u; and
# its weight (TRAINER.DAEL.WEIGHT_OTHER, 1.0 in the other rows) in its row with L_u.
# (parts, L_u on, output folder's name, WEIGHT_OTHER or None)
_PART_RUNS = [
    ("experts", False, "dael_part_experts", None),
    ("ensemble", False, "dael_part_ensemble", None),
    ("cr", False, "dael_part_cr", None),
    ("pseudo_label", True, "dael_part_pseudo_label", None),
    ("experts,ensemble", False, "dael_part_experts_ensemble", None),
    ("other,ensemble", False, "dael_part_other_ensemble_no_lu", None),
    ("other,ensemble,pseudo_label", True, "dael_part_other_ensemble_pseudo_label", None),
    ("other,ensemble,cr,pseudo_label", True, "dael_part_other_ensemble_cr_pseudo_label", None),
    ("other,ensemble,pseudo_label", True, "dael_part_other_ensemble_pseudo_label_w0.25", "0.25"),
    ("other,ensemble,pseudo_label", True, "dael_part_other_ensemble_pseudo_label_w4", "4"),
]
PARTS = {
    f"DAEL (CLASS_MASKS {parts}{'' if lu else ', no L_u'}{f', WEIGHT_OTHER {w}' if w else ''})": (
        "DAEL",
        _DAEL_CFG,
        ["TRAINER.DAEL.CLASS_MASKS", parts]
        + ([] if lu else ["TRAINER.DAEL.LOSSES", "ce_cr"])
        + (["TRAINER.DAEL.WEIGHT_OTHER", w] if w else []),
    )
    for parts, lu, _, w in _PART_RUNS
}
# The pseudo-labelling rules (--rules; docs/category_shift.md, "Pseudo-labelling rules"), each against
# today's two rows with L_u (CLASS_MASKS all, and other,ensemble,pseudo_label) and the best row without.
_RULE_RUNS = [  # (output folder's name, CLASS_MASKS, options)
    ("dael_rule_agree", "all", ["TRAINER.DAEL.PSEUDO_LABEL", "agree"]),
    ("dael_rule_balanced", "all", ["TRAINER.DAEL.U_BALANCE", "True"]),
    ("dael_rule_agree_balanced", "all", ["TRAINER.DAEL.PSEUDO_LABEL", "agree", "TRAINER.DAEL.U_BALANCE", "True"]),
    ("dael_rule_corroborate", "other,ensemble,pseudo_label", ["TRAINER.DAEL.PSEUDO_LABEL", "corroborate"]),
]
RULES = {
    f"DAEL (CLASS_MASKS {parts}, {' '.join(o.split('.')[-1] for o in opts)})": (
        "DAEL",
        _DAEL_CFG,
        ["TRAINER.DAEL.CLASS_MASKS", parts] + opts,
    )
    for _, parts, opts in _RULE_RUNS
}
# With --rules the table also holds these rows (today's rules and the best row without L_u).
RULE_BASELINES = (
    "SourceOnly",
    "DAEL (CLASS_MASKS)",
    "DAEL (CLASS_MASKS, no L_u)",
    "DAEL (CLASS_MASKS other,ensemble,pseudo_label)",
)
SLUGS = {
    **{m: slug for m, (slug, _, _) in zip(RULES, _RULE_RUNS)},
    **{m: slug for m, (_, _, slug, _) in zip(PARTS, _PART_RUNS)},
    "SourceOnly": "source_only",
    "DAEL (naive: the union as one label set)": "dael_naive",
    "DAEL (CLASS_MASKS)": "dael_masks",
    "DAEL (CLASS_MASKS, PSEUDO_LABEL ensemble)": "dael_masks_pl_ensemble",
    "DAEL (CLASS_MASKS, no L_u)": "dael_masks_no_lu",
    "DAEL (naive, no L_u)": "dael_naive_no_lu",
}


ALL_ROWS = {**METHODS, **ABLATIONS, **PARTS, **RULES}


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def build_set(root: str, split: int = 1) -> str:
    """``<root>/embedded_digits_cs`` (split 1) or ``embedded_digits_cs2`` (split 2), made once from
    the embedded set under ``root``. Safe when several processes ask at once (two benchmarks on one
    --root, the suite's workers): one builds it under the kernel's lock on ``<root>/.<name>.lock``,
    into a temporary folder renamed into place when whole; the others wait, then read it. A copy
    that a run may be reading is never replaced, only one an older version made."""
    import filelock

    from dael_plugin.data.embedded import DATASET_DIR, VERSION, ensure_embedded

    ensure_embedded(root)
    sources = SPLITS[split]
    out = os.path.join(root, SET_DIRS[split])
    stamp = f"{VERSION} category-shift {json.dumps(sources, sort_keys=True)}"

    def made() -> bool:
        path = os.path.join(out, "VERSION")
        return os.path.isfile(path) and open(path).read() == stamp

    if made():
        return out
    try:
        with filelock.FileLock(os.path.join(root, f".{SET_DIRS[split]}.lock")):
            if made():  # another process made it while this one waited
                return out
            src = os.path.join(root, DATASET_DIR)
            tmp = f"{out}.tmp.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            for domain in list(sources) + [TARGET]:
                keep = sources.get(domain, "0123456789")
                for part in ("train", "test"):
                    for digit in keep:
                        s, d = os.path.join(src, domain, part, digit), os.path.join(tmp, domain, part, digit)
                        os.makedirs(d)
                        for name in sorted(os.listdir(s)):
                            _link(os.path.join(s, name), os.path.join(d, name))
            with open(os.path.join(tmp, "VERSION"), "w") as f:
                f.write(stamp)
            shutil.rmtree(out, ignore_errors=True)  # an older version's copy
            os.replace(tmp, out)
    except OSError as exc:  # a read-only or full --root: one line, not a traceback
        raise DAELConfigError(
            f"could not make the category-shift set {out} ({exc.strerror or exc}); pass a --root you can write to"
        ) from exc
    return out


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def identity(args, method: str, seed: int) -> Dict:
    """Everything that makes a row's run: a folder's record is reused only for exactly these."""
    trainer, cfg, extra = ALL_ROWS[method]
    return {
        "engine": args.engine,
        "trainer": trainer,
        "seed": seed,
        "epochs": args.epochs,
        "options": list(extra) + _record_options(args),
        "config": cfg,
        "config_sha256": _sha256(os.path.join(ROOT, cfg)),
        "dataset_config_sha256": _sha256(os.path.join(ROOT, DATASET_CFG)),
        "sources": SPLITS[args.split],
        "target": TARGET,
    }


def output_folder(args) -> str:
    """``--output``, or one folder per engine and split: the two engines' runs of a row never share one."""
    if args.output:
        return args.output
    return os.path.join(ROOT, "output", "category_shift", *([] if args.split == 1 else ["split2"]), args.engine)


def _record_options(args) -> List[str]:
    """``--records N``: records every N epochs with a held-out part of each source (``SELECTION.EVAL_FREQ N``),
    so that ``source_val``, ``last`` and the oracle can choose (docs/selection.md)."""
    return ["SELECTION.EVAL_FREQ", str(args.records)] if args.records else []


def _run(args, method: str, seed: int, data: str) -> Dict:
    """One row's run for one seed. Its folder keeps the settings it was launched with
    (``IDENTITY``): a record is reused only under the same settings, and a folder of other
    settings is refused in one line (``--epochs 5`` after 15, another engine, an edited config).
    A folder without them (written before they were kept) goes through scripts/train.py, which
    says "nothing to do" for a finished run of this config, resumes an unfinished one and refuses
    another config or engine."""
    trainer, cfg, extra = ALL_ROWS[method]
    out = os.path.join(args.output, f"{SLUGS[method]}_seed{seed}")
    record = os.path.join(out, "results.json")
    want = identity(args, method, seed)
    changed = settings_changes(os.path.join(out, IDENTITY), want)
    if changed:
        raise SystemExit(
            f"error: {out} holds a run of other settings ({'; '.join(changed)}); pass another --output, or move "
            "the folder aside"
        )
    if changed == [] and os.path.isfile(record):
        return json.load(open(record))
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--engine", args.engine, "--trainer", trainer]
    cmd += ["--root", data, "--dataset-config-file", os.path.join(ROOT, DATASET_CFG)]
    cmd += ["--config-file", os.path.join(ROOT, cfg), "--source-domains", *SPLITS[args.split]]
    cmd += ["--target-domains", TARGET, "--output-dir", out, "--seed", str(seed), "OPTIM.MAX_EPOCH", str(args.epochs)]
    cmd += [*extra, *_record_options(args)]
    print(f"[category shift] {method}, seed {seed}: {out}", flush=True)
    if os.path.isfile(record):  # an older folder: train.py checks its config and engine
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    else:
        os.makedirs(out, exist_ok=True)
        write_json(os.path.join(out, IDENTITY), want)
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL if args.quiet else None)
    if proc.returncode != 0:
        raise SystemExit(
            f"error: the run {out} failed (exit {proc.returncode}); the line above or its log.txt says why"
        )
    write_json(os.path.join(out, IDENTITY), want)
    return json.load(open(record))


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.path.join(ROOT, "data"), help="where the embedded set is (or is made)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument(
        "--split",
        type=int,
        nargs="+",
        default=[1],
        choices=sorted(SPLITS),
        help="the split(s), one table each (with --output and two splits, a folder split<N> each); which "
        "sources hold which digits: "
        + "; ".join(f"{n}: " + ", ".join(f"{d} {c}" for d, c in src.items()) for n, src in SPLITS.items()),
    )
    p.add_argument(
        "--records",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="records every N epochs (1 when not given) on a held-out part of each source (SELECTION.EVAL_FREQ N): "
        "the table adds the epochs chosen by source_val and the oracle, and the rule source_val chooses among "
        "the DAEL rows with L_u",
    )
    p.add_argument("--rules", action="store_true", help="the pseudo-labelling rules: " + "; ".join(RULES))
    p.add_argument("--engine", default="builtin", choices=("builtin", "dassl"))
    p.add_argument(
        "--output", default=None, help="where the runs go (default: output/category_shift/<engine>, one per engine)"
    )
    p.add_argument("--quiet", action="store_true", help="keep the runs' own output off the terminal")
    p.add_argument("--ablations", action="store_true", help="also " + "; ".join(ABLATIONS))
    p.add_argument("--parts", action="store_true", help="also each part of CLASS_MASKS alone: " + "; ".join(PARTS))
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=sorted(SLUGS.values()),
        help="just these rows, by output folder name",
    )
    args = p.parse_args(argv)
    try:
        for split in dict.fromkeys(args.split):
            output = args.output
            if output and len(set(args.split)) > 1:
                output = os.path.join(output, f"split{split}")
            _main(argparse.Namespace(**{**vars(args), "split": split, "output": output}))
        return 0
    except DAELConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _check_args(args) -> None:
    """The benchmark's own arguments, before any run: each one line."""
    if args.epochs < 1:  # a run of 0 epochs would finish as a result and keep the folder for good
        raise DAELConfigError(f"--epochs {args.epochs}: give at least 1")
    twice = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
    if twice:  # a seed counted twice would weigh one run double in the mean and the spread
        raise DAELConfigError(f"--seeds lists seed(s) {twice} more than once; list each seed once")
    if args.records < 0:
        raise DAELConfigError(f"--records {args.records}: give the epochs between records (1 or more)")
    if os.path.lexists(args.output) and not os.path.isdir(args.output):
        raise DAELConfigError(f"--output {args.output} exists and is not a folder; pass a folder for the runs")


def _main(args) -> int:
    args.output = os.path.abspath(os.path.expanduser(output_folder(args)))
    _check_args(args)
    data = build_set(os.path.abspath(os.path.expanduser(args.root)), args.split)
    methods = list(METHODS) + (list(ABLATIONS) if args.ablations else []) + (list(PARTS) if args.parts else [])
    if args.rules:
        methods = [m for m in methods if m not in RULE_BASELINES] + list(RULE_BASELINES) + list(RULES)
    if args.only:
        methods = [m for m in ALL_ROWS if SLUGS[m] in args.only]
    rows = {m: [_run(args, m, s, data) for s in args.seeds] for m in methods}
    sources = SPLITS[args.split]
    single = single_source_digits(sources)
    print(
        f"\nTarget {TARGET} (all 10 digits); split {args.split}, sources "
        + "; ".join(f"{d}: {' '.join(c)}" for d, c in sources.items())
    )
    print(f"{args.epochs} epochs, engine {args.engine}, seeds {args.seeds}; target test accuracy (%), mean ± std")
    head = f"{' '.join(single)} (one source each)"
    sel = " | source_val's epoch" if args.records else ""
    print(f"{'method':<70} | {'last epoch':>15} | {head:>26}{sel} | pseudo-labels kept, right")
    for method, recs in rows.items():
        acc = [r["accuracy"] for r in recs]
        one_source = [single_source_accuracy(r, single) for r in recs]
        kept = [last_pseudo_labels(r) for r in recs]
        pl = "—"
        if all(k is not None for k in kept):
            right = [k[1] for k in kept if k[1] == k[1]]
            pl = f"{statistics.fmean(k[0] for k in kept):.1f}%, " + (
                f"{statistics.fmean(right):.1f}%" if right else "— (none kept)"
            )
        one = "— (no per-class accuracy)"  # Dassl's own trainers write none to results.json
        if all(v == v for v in one_source):
            one = f"{statistics.fmean(one_source):17.2f} ± {sd(one_source):5.2f}"
        chosen = ""
        if args.records:
            chosen = f" | {chosen_text(recs, 'source_val')}"
        print(f"{method:<70} | {statistics.fmean(acc):6.2f} ± {sd(acc):5.2f} | {one:>26}{chosen} | {pl}")
    if args.records:  # the DAEL rows with L_u, as one grid of settings
        grid = {
            SLUGS[m]: recs for m, recs in rows.items() if ALL_ROWS[m][0] == "DAEL" and "ce_cr" not in ALL_ROWS[m][2]
        }
        for protocol in ("source_val", "oracle"):
            print(rule_choice(grid, args.seeds, protocol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
