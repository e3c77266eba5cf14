#!/bin/bash
# Device check (2026-11-26, H200, second call): with the fix (the first step of a fit off the schedule's
# clock), a compiled time-budgeted fit must ramp its warm-up over the steps after the compile.
# Before the fix the lr logged at step 49 of such a fit was 99.98% of peak (gpu_run.sh's run).
export PYTHONUNBUFFERED=1 VIT_CACHE_DIR=/tmp/vitcache PYTHONPATH=/tmp/site:$PWD
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
timeout 150 python3 scripts/train.py -c experiments/cifar10_full.yaml --data.data_dir .devdata/cifar10-jpeg.tar.gz \
  --trainer.enable_progress_bar false --data.batch_size 512 --model.lr 2e-3 --model.warmup_epochs 0 \
  --model.warmup_fraction 0.2 --model.time_budget_min 1.0 --trainer.log_every_n_steps 10 \
  --test_after_fit false --trainer.callbacks.init_args.every_n_epochs 1000 > "$OUT/train.txt" 2>&1
echo "train exit $?"; tail -3 "$OUT/train.txt"
python3 - <<'PY'
import csv, glob
path = sorted(glob.glob("runs/cifar10_full/version_*/metrics.csv"))[-1]
rows = [r for r in csv.DictReader(open(path)) if r.get("train/lr")]
print("step, lr / peak (warm-up: the first 20% of the 60 s after the first step)")
for r in rows[:12] + rows[-2:]:
    print(r["step"], round(float(r["train/lr"]) / 2e-3, 4))
PY
