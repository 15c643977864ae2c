#!/usr/bin/env bash
# The whole GPU benchmark of README "Speed" in one command, in under 9 minutes
# on one H100/H200: the step at both shapes (Dassl's DAEL and the plugin's
# configurations, blocks of steps timed between CUDA events, per-option shares,
# peak memory), launches per step, views on the device, epochs against Dassl's
# own trainer at 96x96 on both engines, and the GPU tests (no host sync with
# every execution option, fp16, grouped against split batch norm, CUDA graphs
# replayed, the paper's views on the device).
#
#   scripts/gpu_bench.sh [OUTDIR]          (default output/gpu_bench)
#
# Needs a CUDA GPU and Dassl importable in this Python (install it by hand
# from its own repository, or put a checkout's root on PYTHONPATH); this
# script installs nothing. Every ratio it prints is measured in this one run.
set -uo pipefail
out=$(realpath -m "${1:-output/gpu_bench}")
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1

python - <<'EOF' || exit 2
import sys, torch
if not torch.cuda.is_available():
    sys.exit("error: no CUDA GPU visible; scripts/gpu_bench.sh times the GPU path")
try:
    import dassl  # noqa: F401
except ImportError:
    sys.exit("error: Dassl is not importable; install it by hand (README) or set PYTHONPATH to a Dassl checkout")
print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

start=$(date +%s)
# Step at both shapes + launches + views on the device + the epoch at 96x96 (about 5 minutes).
timeout 360 python scripts/bench.py --shape both --epoch --workers 12 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
# Several processes: collectives and bytes per step, and DDP's overhead at N=1 on this GPU.
timeout 120 python scripts/bench_ddp.py --time 2>&1 | tee "$out/ddp.txt"
timeout 30 python scripts/bench_device_aug.py --device cuda --batch 256 --size 96 2>&1 | tee "$out/device_aug.txt"
# The GPU tests (about 2 minutes, most of it compiling the reduce-overhead cases).
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}
echo "gpu_bench: bench exit $bench_rc, GPU tests exit $tests_rc, $(( $(date +%s) - start )) s" | tee -a "$out/bench.txt"
[ "$bench_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ]
