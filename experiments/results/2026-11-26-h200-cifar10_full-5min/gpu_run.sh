#!/bin/bash
# Device check (issues 3 and 6): smoke-train, the GPU benchmark table, then the full-length recipe
# under a wall-clock budget of $1 minutes. Everything it keeps goes to $OUT as it is made.
B=${1:-5.0}
export PYTHONUNBUFFERED=1 VIT_CACHE_DIR=/tmp/vitcache
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
nvidia-smi -L; lscpu | grep -m1 "Model name"
python3 -c "import torch, torchvision, lightning, torchmetrics, timm, einops, jsonargparse; print('torch', torch.__version__, 'tv', torchvision.__version__, 'L', lightning.__version__, 'tm', torchmetrics.__version__, 'timm', timm.__version__, 'einops', einops.__version__, 'jap', jsonargparse.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -p no:cacheprovider tests/test_benchmark.py 2>&1 | tail -2
DATA=.devdata/cifar10-jpeg.tar.gz
COMMON="-c experiments/cifar10_full.yaml --data.data_dir $DATA --trainer.enable_progress_bar false --model.warmup_epochs 0 --model.warmup_fraction 0.033"
stamp smoke
python3 scripts/train.py $COMMON --model.time_budget_min 0.3 || { stamp "smoke FAILED"; exit 2; }
stamp bench
python3 scripts/benchmark.py --device cuda --name gpu-h200 --rounds 5
cp experiments/benchmarks/gpu-h200.json experiments/benchmarks/gpu-h200.md "$OUT/"
B=$(python3 -c "import sys; print(round(min(float(sys.argv[1]), (565 - int(sys.argv[2]) - 85) / 60), 2))" "$B" "$(( $(date +%s) - T0 ))")
stamp "full recipe, $B min"
python3 scripts/train.py $COMMON --model.time_budget_min "$B"
stamp "train done"
RUN=$(ls -d runs/cifar10_full/version_* | sort -V | tail -1)
BEST=$(ls "$RUN"/checkpoints/best-*.ckpt | head -1)
echo "run $RUN best $BEST"
python3 -c "from vit.cli import evaluate_main; evaluate_main()" "$BEST" --output-dir "$RUN/eval-test"
python3 -c "from vit.cli import evaluate_main; evaluate_main()" "$BEST" --split val --no-flip --output-dir "$RUN/eval-val"
python3 -c "from vit.checkpoint import export_safetensors as e; import sys; e(sys.argv[1], sys.argv[2])" "$BEST" "$OUT/best.safetensors"
tar czf "$OUT/run.tar.gz" --exclude='*.ckpt' "$RUN"
stamp end
