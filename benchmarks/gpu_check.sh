#!/usr/bin/env bash
# The GPU checks of issue 27 in one go, for a session that is lent a CUDA GPU (run from the repository root):
#   bash benchmarks/gpu_check.sh            # logs and tables under $OUT (default: gpu_check_out)
# 1. the venv as the README makes it (skipped when .venv already imports xbench_pl), 2. `pytest -m cuda`,
# 3. bench_full_scale.py on CUDA for the CLIP-class and ResNet models in 32-true and bf16-mixed, and on the CPU for
# the same maps' baseline, 4. bench_metrics.py on CUDA, 5. bench_generative.py at the releases' sizes, 6. issue 44's
# explainers against their floor and deletion's pairs per forward on CUDA. Every step has a timeout and goes on after a failure;
# the exit status is the number of steps that failed.
set -x
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
PY=.venv/bin/python
failed=0
step() {  # step NAME SECONDS COMMAND...: its output teed into $OUT/NAME.log
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local code=${PIPESTATUS[0]}
  echo "$name: exit $code" | tee -a "$OUT/summary.txt"
  [ "$code" -eq 0 ] || failed=$((failed + 1))
}
{ nvidia-smi; $PY -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())"; } \
  > "$OUT/device.txt" 2>&1
if ! $PY -c "import xbench_pl, lightning" 2>/dev/null; then
  step install 900 bash -c "python3 -m venv .venv && .venv/bin/pip install torch==2.14.1 torchvision==0.29.1 && .venv/bin/pip install -e '.[dev]'"
fi
step pytest_cuda 1200 $PY -m pytest -m cuda -q -x --durations=15 -p no:cacheprovider
MODELS="clip biomedclip chexzero kad_224 kad_512 biovil"
step bench_full_scale_fp32 600 $PY benchmarks/bench_full_scale.py --device cuda --limit 200 --models $MODELS
step bench_full_scale_bf16 600 $PY benchmarks/bench_full_scale.py --device cuda --limit 200 --precision bf16-mixed --models $MODELS
step bench_full_scale_cpu 600 $PY benchmarks/bench_full_scale.py --device cpu --limit 4 --models clip kad_224
step bench_metrics_cuda 600 $PY benchmarks/bench_metrics.py --device cuda
# 5. the grounded generative models at their release sizes (random weights, bf16): overhead against plain generate
step bench_generative_release 900 $PY benchmarks/bench_generative.py --size release --device cuda --dtype bfloat16 --images 2 \
  --findings 4 --max-new-tokens 64 --repeats 3
# 6. issue 44 on a GPU: floor ratios (rollout, EigenCAM's host SVD, the CAMs' per-finding backwards) and whether
# deletion gains from several pairs per forward, and at what exactness
step bench_explainers_cuda 600 $PY benchmarks/bench_explainers.py --device cuda --models clip medklip carzero \
  --explainers gradcam eigencam rollout chefer --batch 8 --repeats 3
step bench_trust_pairs_cuda 300 $PY benchmarks/bench_trust.py --device cuda --models clip medklip --measures --pairs-per-forward 8
exit $failed
