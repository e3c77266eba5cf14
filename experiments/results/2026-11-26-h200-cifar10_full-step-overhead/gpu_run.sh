#!/bin/bash
# Device check (issue 3, GPU leads; issue 6, the full-length recipe's speed): where a training
# step of cifar10_full.yaml goes on a GPU, before and after this run's changes.
#   A: the code before them (HEAD faf3f20, carried in .devold), eager
#   B: the code after them (host syncs out of augmentation, metrics, logging; pinned batches)
#   C: B with torch.compile; D: B with torch.compile(mode="reduce-overhead"), CUDA graphs
# Each variant trains steps START..STOP of the recipe (no validation) and prints ms/step; B and D
# also profile the last PROF steps. Then the GPU tests and the data pipeline's images/s.
# PHASE=2 (a second call): the same timing without TrivialAugment, without mixing and clipping,
# and at batch 512 (eager and reduce-overhead). PHASE=3: reduce-overhead end to end, 1.2 min.
START=${START:-100} STOP=${STOP:-600} PROF=${PROF:-20}
export PYTHONUNBUFFERED=1 VIT_CACHE_DIR=/tmp/vitcache
HERE=experiments/results/2026-11-26-h200-cifar10_full-step-overhead
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
T0=$(date +%s); stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
nvidia-smi -L; lscpu | grep -m1 "Model name"
NEW=/tmp/site:$PWD:$PWD/$HERE OLD=/tmp/site:$PWD/.devold:$PWD/$HERE
fit() {  # label, PYTHONPATH, profile steps, extra args
  local label=$1 path=$2 prof=$3; shift 3
  local CB="[{\"class_path\": \"step_timer.StepTimer\", \"init_args\": {\"start\": $START, \"stop\": $STOP, \"profile\": PROFILE}}]"
  stamp "$label"
  VARIANT=$label PYTHONPATH=$path timeout ${FIT_TIMEOUT:-170} python3 scripts/train.py -c experiments/cifar10_full.yaml \
    --data.data_dir .devdata/cifar10-jpeg.tar.gz --trainer.enable_progress_bar false \
    --trainer.logger false --trainer.enable_checkpointing false --trainer.limit_val_batches 0 \
    --trainer.num_sanity_val_steps 0 --test_after_fit false --trainer.default_root_dir /tmp/fit \
    --trainer.callbacks "${CB/PROFILE/$prof}" $EXTRA "$@" > "$OUT/$label.txt" 2>&1
  grep -v "^\s*$" "$OUT/$label.txt" | grep -v "^TIMER" | tail -${TAIL:-8}; grep "^TIMER" "$OUT/$label.txt"
}
if [ "${PHASE:-1}" = 1 ]; then
fit A-before-eager "$OLD" 0
fit B-after-eager "$NEW" "$PROF"
fit A-before-eager-again "$OLD" 0
stamp "gpu tests"
PYTHONPATH=$NEW python3 -m pytest -q -p no:cacheprovider tests/test_augment.py tests/test_trivial_augment.py \
  tests/test_lit_module.py -k "not lit_module or non_finite or fit_logs or soft_targets or time_budget" 2>&1 | tail -15
stamp "data pipeline"
for which in OLD NEW; do
  PYTHONPATH=${!which} python3 -c "
import sys; sys.path.insert(0, 'scripts'); import benchmark as b
plain = b.bench_data(device='cuda'); ta = b.bench_data(trivial=True, max_batches=40, device='cuda')
print('DATA $which: plain', round(plain), 'img/s; with TrivialAugment', round(ta), 'img/s')"
done
fit C-after-compile "$NEW" 0 --model.torch_compile true
fit D-after-reduce-overhead "$NEW" "$PROF" --model.torch_compile true --model.compile_mode reduce-overhead
elif [ "$PHASE" = 3 ]; then  # phase 3: reduce-overhead end to end (validation, checkpoints, test)
stamp "E2E reduce-overhead"
PYTHONPATH=$NEW timeout 170 python3 scripts/train.py -c experiments/cifar10_full.yaml \
  --data.data_dir .devdata/cifar10-jpeg.tar.gz --trainer.enable_progress_bar false \
  --model.torch_compile true --model.compile_mode reduce-overhead --model.warmup_epochs 0 \
  --model.warmup_fraction 0.05 --model.time_budget_min 1.2 > "$OUT/E2E.txt" 2>&1
echo "exit $?"; grep -v "^\s*$" "$OUT/E2E.txt" | tail -30
else  # phase 2: what the remaining host time is made of, and a larger batch (speed only)
fit E-after-eager-noTA "$NEW" 0 --data.trivial_augment false
fit F-after-eager-noTA-nomix-noclip "$NEW" 0 --data.trivial_augment false --model.mixup_alpha 0 \
  --model.cutmix_alpha 0 --trainer.gradient_clip_val null
START=40 STOP=160
fit H-after-eager-batch512 "$NEW" 0 --data.batch_size 512
fit G-after-reduce-overhead-batch512 "$NEW" 0 --data.batch_size 512 --model.torch_compile true \
  --model.compile_mode reduce-overhead
fi
stamp end
grep "^TIMER\|^DATA" "$OUT/log.txt" > "$OUT/summary${PHASE:-1}.txt"
