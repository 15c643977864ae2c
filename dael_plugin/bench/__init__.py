"""The benchmarks and the GPU checks (``scripts/bench.py``, ``bench_ddp.py``, ``bench_device_aug.py``,
``gpu_checks.py`` are their entry points): what docs/speed.md reports, measured in one run."""
