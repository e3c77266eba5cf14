#!/usr/bin/env bash
# Issue 3's measurements that need a CPU with AMX-BF16 (the kind of machine the issue was written
# on; every run after the one of 2026-11-25 had an AMD CPU without it). From the repository root
# at commit 53b4d76 (its ablate_speed.py steps need that script, retired since:
# git checkout 53b4d76), with the bench extra installed (pip install -e ".[bench]") and nothing
# else running:
#
#     bash scripts/amx_check.sh
#
# Writes experiments/record/benchmarks/cpu-amx.{json,md} (the benchmark's table with its matmul ceiling)
# and experiments/record/benchmarks/amx/ (64 vs 65 tokens: lead 8 is about AMX's 16-row tiles; compile's
# default mode vs max-autotune, whose C++ GEMM template has an AMX micro-kernel; the lead table).
# Not timed on an AMX machine yet: the whole benchmark comes first, since it is the table issue 3
# lacks, and each step writes its table as it ends, so a machine taken back midway keeps those.
set -euo pipefail
if ! grep -qw amx_bf16 /proc/cpuinfo; then
    echo "amx_check.sh: this CPU has no AMX-BF16 (no amx_bf16 flag in /proc/cpuinfo), so its" \
        "figures would repeat the AVX-512 or AVX2 tables already in experiments/record/benchmarks/." \
        "Run it on an Intel Xeon of the 4th generation (Sapphire Rapids) or later." >&2
    exit 2
fi
python="${PYTHON:-python}"
"$python" scripts/benchmark.py --name cpu-amx
"$python" scripts/ablate_speed.py --tokens --out experiments/record/benchmarks/amx
"$python" scripts/ablate_speed.py --compile-modes --out experiments/record/benchmarks/amx
"$python" scripts/ablate_speed.py --out experiments/record/benchmarks/amx
