"""The GPU paths no CPU run takes, run for real: one line per check, PASS or FAIL, and a JSON summary.

    python scripts/gpu_checks.py --out DIR [--quick] [--device cuda|cpu] [--root DATA]

Checks (independent chains run at once, each in its own processes):

- ``torchrun-<engine>``: DAEL under ``torchrun --nproc_per_node 1`` (NCCL on CUDA: the process
  group, DDP, the synchronised batch norm, the host group's flags and objects), killed with
  SIGKILL after its first epoch's checkpoint and run again: it must resume from that epoch and
  finish. Both engines.
- ``resume-<engine>``: the same in one process without torchrun (a checkpoint read back onto
  the GPU: RNG, NumPy and loader-generator states must stay CPU tensors).
- ``prec-<fp32|bf16|fp16>``: a short DAEL run in each precision; bf16 and fp16 must finish with
  finite weights and a target accuracy within ``--prec-gap`` points of fp32's (the spread between
  seeds of these short runs is a few points).

Without ``--quick`` each resumed run is also compared with an uninterrupted one (the weights'
largest difference is reported; a GPU run is not bitwise repeatable with cuDNN's autotuner on),
and the precision runs are longer. ``--device cpu`` runs the same checks on the CPU (gloo), as a
dry run of this script. Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository: configs/, scripts/

TRAIN = os.path.join(ROOT, "scripts", "train.py")
DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
CFG = os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")


def base_args(root: str, out: str, engine: str, epochs: int, device: str, extra=()) -> list:
    return [
        TRAIN,
        "--engine",
        engine,
        "--trainer",
        "DAEL",
        "--root",
        root,
        "--dataset-config-file",
        DS,
        "--config-file",
        CFG,
        "--source-domains",
        "hand",
        "blend",
        "font",
        "--target-domains",
        "street",
        "--seed",
        "1",
        "--output-dir",
        out,
        "OPTIM.MAX_EPOCH",
        str(epochs),
        "USE_CUDA",
        str(device == "cuda"),
        "DATALOADER.NUM_WORKERS",
        "2",
        "TRAIN.PRINT_FREQ",
        "5",
        *extra,
    ]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("DAEL_DIST_TIMEOUT", "120")
    return env


def _cmd(args: list, torchrun: bool) -> list:
    if torchrun:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"] + args
    return [sys.executable] + args


TIMEOUT = [400.0]  # seconds for one training command (--timeout)


def run(args: list, torchrun: bool, log: str) -> int:
    """One training command; 124 when it ran past ``--timeout`` (it is killed, with its workers)."""
    with open(log, "a") as f:
        job = subprocess.Popen(
            _cmd(args, torchrun), cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return job.wait(timeout=TIMEOUT[0])
        except subprocess.TimeoutExpired:
            _kill_all(job)
            f.write(f"\ngpu_checks: killed after {TIMEOUT[0]:.0f} s\n")
            return 124


def _epoch(path: str):
    from dael_plugin.engine.checkpoint import checkpoint_epoch

    return checkpoint_epoch(path) if os.path.isfile(path) else None


def _kill_all(job: subprocess.Popen) -> None:
    """SIGKILL to the launcher and every process below it (torchrun starts workers in sessions of their own)."""
    found, todo = [], [job.pid]
    while todo:
        pid = todo.pop()
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        found += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    for pid in [job.pid] + found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.wait(timeout=60)


def killed_and_resumed(name: str, args: list, torchrun: bool, out: str, epochs: int) -> dict:
    """Run, SIGKILL after the first checkpoint, run again; the second run must resume and finish."""
    log = os.path.join(out, "log_driver.txt")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "checkpoint.pth.tar")
    with open(log, "a") as f:
        job = subprocess.Popen(
            _cmd(args, torchrun), cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + TIMEOUT[0]
        while time.time() < deadline and job.poll() is None and (_epoch(ckpt) or 0) < 1:
            time.sleep(0.05)
        if job.poll() is not None:
            return {"name": name, "ok": False, "why": f"ended (exit {job.returncode}) before it could be killed"}
        _kill_all(job)  # also when the deadline passed without a checkpoint: then the check fails below
    killed_at = _epoch(ckpt)
    if killed_at is None or killed_at >= epochs:
        return {"name": name, "ok": False, "why": f"killed at epoch {killed_at} of {epochs}"}
    start = time.time()
    rc = run(args, torchrun, log)
    text = open(log, errors="replace").read()
    resumed = f"will resume training from epoch {killed_at + 1}" in text
    record = _results(out)
    acc = record.get("accuracy")
    ok = rc == 0 and resumed and acc is not None and not _fell_back(record)
    why = "" if ok else f"exit {rc}, resumed {resumed}, accuracy {acc}, {_check_text(record)}; see {log}"
    return {
        "name": name,
        "ok": ok,
        "why": why,
        "killed_at": killed_at,
        "accuracy": acc,
        "resume_s": time.time() - start,
        "fast_path_check": record.get("fast_path_check"),
    }


def _results(out: str) -> dict:
    path = os.path.join(out, "results.json")
    return json.load(open(path)) if os.path.isfile(path) else {}


def _fell_back(record: dict) -> bool:
    """Whether the fused pass failed its first-step check (engine/first_step_check.py) in this run."""
    return bool((record.get("fast_path_check") or {}).get("fell_back"))


def _check_text(record: dict) -> str:
    found = record.get("fast_path_check")
    return "no first-step check" if not found else f"first-step check {found}"


def weight_gap(a: str, b: str):
    """The largest absolute difference between two runs' final weights."""
    import torch

    from dael_plugin.engine.checkpoint import load_checkpoint

    sa, sb = load_checkpoint(a), load_checkpoint(b)
    key = "model" if "model" in sa else "models"
    flat = {}
    for s, tag in ((sa, 0), (sb, 1)):
        w = s[key] if key == "model" else {f"{m}.{k}": v for m, sd in s[key].items() for k, v in sd.items()}
        flat[tag] = {k: v for k, v in w.items() if torch.is_tensor(v) and v.is_floating_point()}
    return max((flat[0][k].double() - flat[1][k].double()).abs().max().item() for k in flat[0])


def compare_uninterrupted(check: dict, args: list, torchrun: bool, out: str) -> dict:
    full = out + "_full"
    args_full = [full if a == out else a for a in args]
    os.makedirs(full, exist_ok=True)
    rc = run(args_full, torchrun, os.path.join(full, "log_driver.txt"))
    if rc != 0:
        return {**check, "ok": False, "why": f"the uninterrupted run failed (exit {rc}); see {full}"}
    gap = weight_gap(os.path.join(out, "checkpoint.pth.tar"), os.path.join(full, "checkpoint.pth.tar"))
    acc = json.load(open(os.path.join(full, "results.json")))["accuracy"]
    return {**check, "uninterrupted_accuracy": acc, "weight_gap": gap}


def precision_run(prec: str, root: str, out: str, epochs: int, device: str) -> dict:
    out = os.path.join(out, f"prec_{prec}")
    os.makedirs(out, exist_ok=True)
    args = base_args(root, out, "builtin", epochs, device, ["TRAINER.DAEL.PREC", prec])
    start = time.time()
    rc = run(args, False, os.path.join(out, "log_driver.txt"))
    record = _results(out)
    acc = record.get("accuracy")
    ok = rc == 0 and acc is not None and not _fell_back(record)
    return {
        "name": f"prec-{prec}",
        "ok": ok,
        "why": "" if ok else f"exit {rc}, {_check_text(record)}; see {out}",
        "accuracy": acc,
        "seconds": time.time() - start,
        "fast_path_check": record.get("fast_path_check"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--root", default="", help="data root (default: OUT/data; the embedded set is made there)")
    p.add_argument("--quick", action="store_true", help="the crash-prone paths only, short runs")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--prec-gap", type=float, default=10.0, help="points bf16/fp16 may trail fp32")
    p.add_argument("--engines", nargs="+", default=["builtin", "dassl"], choices=("builtin", "dassl"))
    p.add_argument("--timeout", type=float, default=400.0, help="seconds for one training command")
    a = p.parse_args()
    TIMEOUT[0] = a.timeout
    out = os.path.abspath(a.out)
    root = os.path.abspath(a.root or os.path.join(out, "data"))
    os.makedirs(out, exist_ok=True)
    from dael_plugin.data.embedded import ensure_embedded

    ensure_embedded(root)  # once, before the runs start side by side
    resume_epochs, prec_epochs = (3, 4) if a.quick else (3, 8)
    jobs = []
    for engine in a.engines:
        for torchrun in (True, False):
            name = f"{'torchrun' if torchrun else 'resume'}-{engine}"
            d = os.path.join(out, name)
            jobs.append((name, base_args(root, d, engine, resume_epochs, a.device), torchrun, d))
    started = time.time()
    with ThreadPoolExecutor(max_workers=len(jobs) + 3) as pool:
        futs = [pool.submit(killed_and_resumed, n, args, tr, d, resume_epochs) for n, args, tr, d in jobs]
        precs = [pool.submit(precision_run, pr, root, out, prec_epochs, a.device) for pr in ("fp32", "bf16", "fp16")]
        checks = [f.result() for f in futs]
        if not a.quick:
            checks = list(
                pool.map(lambda cj: compare_uninterrupted(cj[0], cj[1][1], cj[1][2], cj[1][3]), zip(checks, jobs))
            )
        prec = [f.result() for f in precs]
    base = prec[0]["accuracy"]
    for r in prec[1:]:
        if r["ok"] and base is not None and r["accuracy"] < base - a.prec_gap:
            r.update(ok=False, why=f"{r['accuracy']:.1f}% against fp32's {base:.1f}% (allowed gap {a.prec_gap})")
    checks += prec
    for c in checks:
        extra = {
            k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items() if k not in ("name", "ok", "why")
        }
        print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']}: {c['why'] or extra}")
    summary = {"device": a.device, "quick": a.quick, "seconds": time.time() - started, "checks": checks}
    with open(os.path.join(out, "gpu_checks.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"gpu_checks: {sum(c['ok'] for c in checks)}/{len(checks)} passed in {summary['seconds']:.0f} s")
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
