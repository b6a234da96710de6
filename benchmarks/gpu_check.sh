#!/usr/bin/env bash
# The GPU session's checks, in one run (device tool: `bash benchmarks/gpu_check.sh`, timeout ~540 s):
# the CUDA and Triton kernels' tests on the GPU (exact agreement with the reference, the full
# chi-square grid, 64-bit offsets, opcheck), then the verify microbenchmark on the GPU.
# Results go to $OUT (the device tool's folder) or benchmarks/results/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECDEC_FAST_CACHE=/tmp/specdec_fast_cache
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"

# Kernel tests on the GPU: every test parametrised over backends runs for cuda and triton here.
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_backends.py tests/test_verify.py tests/test_verify_block.py tests/test_fuzz.py \
    -k "cuda or triton or every_position or greedy or toy or at_least or fuzz or nan" 2>&1 | tee "$OUT/tests.log" | tail -n 30

# The verify microbenchmark on the GPU (same grid as on the CPU), results beside the tests' log.
timeout 240 python3 benchmarks/microbench.py --device cuda --repeats 20 --out-name microbench_gpu 2>&1 | tail -n 60
cp benchmarks/results/microbench_gpu.* "$OUT/" 2>/dev/null
