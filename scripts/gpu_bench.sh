#!/usr/bin/env bash
# Everything one GPU can run, crash-prone paths first:
#
#   quick part (about 4 minutes):
#     scripts/gpu_checks.py --quick: DAEL under torchrun --nproc_per_node 1 (NCCL, DDP, synchronised
#       batch norm) killed with SIGKILL and resumed, on both engines; a resume onto the GPU in one
#       process, both engines; short fp32, bf16 and fp16 runs, their accuracies side by side;
#     the GPU tests but the compiled ones (no host sync with every execution option, fp16, grouped
#       against split batch norm, the fast path's first-step check, the paper's views on the device);
#   the rest (about 8 minutes), the short steps first:
#     the compiled GPU tests (CUDA graphs replayed); DDP's overhead at N=1; views on the device;
#     then the step at both shapes against Dassl's DAEL (blocks of steps timed between CUDA events,
#     per-option shares, peak memory), launches per step; last, epochs against Dassl's trainer
#     (the compiled row's warm-up epoch compiles, minutes).
#
#   scripts/gpu_bench.sh [--quick | --rest] [OUTDIR]      (default output/gpu_bench; no flag: both parts)
#
# Needs a CUDA GPU and Dassl importable in this Python (install it by hand from its own
# repository, or put a checkout's root on PYTHONPATH); this script installs nothing. Every ratio
# it prints is measured in this one run. Exit status 0 when every part it ran passed.
set -uo pipefail
part=all
case "${1:-}" in
--quick) part=quick; shift ;;
--rest) part=rest; shift ;;
esac
out=$(realpath -m "${1:-output/gpu_bench}")
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1

python - <<'EOF' || exit 2
import sys, torch
if not torch.cuda.is_available():
    sys.exit("error: no CUDA GPU visible; scripts/gpu_bench.sh runs the GPU path")
try:
    import dassl  # noqa: F401
except ImportError:
    sys.exit("error: Dassl is not importable; install it by hand (README) or set PYTHONPATH to a Dassl checkout")
print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

start=$(date +%s)
status=0
step() {  # step NAME TIMEOUT CMD...: run, log to OUTDIR/NAME.txt, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most $limit s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { status=1; echo "gpu_bench: $name FAILED (exit $rc)" | tee -a "$out/summary.txt"; }
    echo "gpu_bench: $name exit $rc at $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
}

if [ "$part" != rest ]; then
    step checks 150 python scripts/gpu_checks.py --quick --out "$out/checks" --timeout 120
    step gpu_tests 100 python -m pytest -q -p no:cacheprovider -x tests/test_gpu.py -m "not compiled"
fi
if [ "$part" != quick ]; then
    # the short steps first, so that a run cut short loses only the bench
    step gpu_tests_compiled 120 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -m compiled
    step ddp 60 python scripts/bench_ddp.py --time
    step device_aug 30 python scripts/bench_device_aug.py --device cuda --batch 256 --size 96
    step bench 240 python scripts/bench.py --shape both
    # Epochs last, with a limit of their own: the compiled row spends its warm-up epoch compiling
    # the step and the views (over 130 s on the H200 on 2026-11-28, when it shared the bench's 300 s).
    step epochs 420 python scripts/bench.py --shape minidomainnet --epoch-only --workers 12
fi
echo "gpu_bench ($part): $(( $(date +%s) - start )) s, exit $status" | tee -a "$out/summary.txt"
exit $status
