#!/usr/bin/env bash
# The GPU session's checks, in one run (device tool: `bash benchmarks/gpu_check.sh`, timeout ~420 s):
# build the CUDA (and CPU) kernels, run every test parametrised over the cuda and triton backends
# on the GPU (exact agreement with the reference, the chi-square grid, 64-bit offsets, opcheck),
# then the verify microbenchmark on the GPU. Results go to $OUT (the device tool's folder) or
# benchmarks/results/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SPECDEC_FAST_CACHE=/tmp/specdec_fast_cache MAX_JOBS=16
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The package as users install it (triton_kernels/ becomes specdec_fast._triton), against the machine's own torch.
python3 -m pip install -q --no-deps --no-build-isolation -e . || { echo "install failed"; exit 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

# Both C++ builds at once (the CPU one only because some test modules load every backend).
SECONDS=0
python3 -c "from specdec_fast.kernels.backends import unavailable; print('cpu:', unavailable('cpu'))" &
timeout 200 python3 -c "from specdec_fast.kernels.backends import unavailable; print('cuda:', unavailable('cuda'))"
wait
echo "builds: ${SECONDS} s" | tee -a "$OUT/gpu.txt"

# One call of each CUDA op first, with a short limit: a kernel that faults or hangs stops the check here.
timeout 60 python3 -c "
import torch, specdec_fast as sf
g = torch.Generator('cuda').manual_seed(0)
for B, K, V in [(2, 3, 1001), (1, 8, 262144), (64, 4, 49152)]:
    q = torch.softmax(torch.randn(B, K, V, device='cuda', generator=g), -1)
    out = sf.verify(torch.randn(B, K + 1, V, device='cuda', generator=g), q, torch.multinomial(q.flatten(0, 1), 1).view(B, K),
                    seed=1, backend='cuda')
    step = sf.draft_step(torch.randn(B, V, device='cuda', generator=g), seed=1, backend='cuda')
    torch.cuda.synchronize()
    print('smoke', B, K, V, out.num_accepted.tolist()[:4], step.tokens.tolist()[:4])
" 2>&1 | tail -n 8 | tee -a "$OUT/gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "smoke test failed"; exit 1; }

# Kernel tests on the GPU: the ids of the cuda and triton params end in "-cuda" there
# (TESTS="cuda and not triton": the CUDA kernels only), and fast_generate and batch_generate on
# the GPU, the feature pair with first-token alternatives among them (TESTS=on_cuda).
SECONDS=0
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider --durations=8 -k "${TESTS:-cuda}" \
    tests/kernels tests/decoding tests/drafts/test_feature_draft.py 2>&1 | tee "$OUT/tests.log" | tail -n 40
echo "tests: ${SECONDS} s" | tee -a "$OUT/gpu.txt"

# The verify microbenchmark on the GPU (same grid as on the CPU); BENCH=0 skips it.
[ "${BENCH:-1}" = 1 ] || exit 0
SECONDS=0
timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/microbench.py --device cuda --repeats ${REPEATS:-10} --out-name microbench_gpu \
    2>&1 | grep -v "it/s\]" | tail -n 110
echo "microbench: ${SECONDS} s" | tee -a "$OUT/gpu.txt"
cp benchmarks/results/microbench_gpu.* "$OUT/" 2>/dev/null
