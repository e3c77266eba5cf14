#!/bin/bash
# Why gpu8.yaml's fit runs far below its bare step (results/2026-11-27-h100-gpu8-seed0: 352 img/s
# in the fit, 23,580 in probe.py's step): short fits of gpu8.yaml, each with one change, their
# img/s side by side. One device call, about 8 minutes (4 fits of 1.5 minutes, compiles included):
#   here, once:     bash scripts/gpu/run_gpu8.sh --prepare
#   on the device:  bash scripts/gpu/diagnose_loop.sh   (run: timeout_s 600, carry .whl .devdata)
#   here, plumbing: bash scripts/gpu/diagnose_loop.sh --dry-run   (CPU, tiny, ~3 min)
# $OUT gets log.txt and diagnose.json (per variant: steps, img/s over the fit, between logs).
# VARIANTS picks some, in order; DEADLINE (epoch seconds) skips those that could not end by then
# (run_gpu8.sh calls it so when its guard stops a slow fit).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODE=${1:-run}
PY=${PYTHON:-python3}
MINUTES=${MINUTES:-1.5}
if [[ $MODE == --dry-run ]]; then
  [[ -x $REPO/.venv/bin/python ]] && PY=$REPO/.venv/bin/python
  OUT=${OUT:-$(mktemp -d /tmp/diagnose-out.XXXX)}
  MINUTES=0.15
fi
: "${OUT:?set OUT to the folder the result files go to}"
WORK=$(mktemp -d /tmp/diagnose.XXXX)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
# the wheels, unless a caller (run_gpu8.sh) has them on PYTHONPATH already
if [[ $MODE == run ]] && compgen -G "$REPO/.whl/*.whl" >/dev/null &&
  ! $PY -c "import jsonargparse" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$REPO"/.whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
DATA=$REPO/.devdata/cifar10-jpeg.tar.gz
[[ -e $DATA ]] || DATA=$REPO/../shared/data/cifar10-jpeg.tar.gz

COMMON=(fit -c "$REPO/experiments/gpu8.yaml" --data.data_dir "$DATA"
  --trainer.callbacks.init_args.minutes "$MINUTES" --trainer.log_every_n_steps 5)
if [[ $MODE == --dry-run ]]; then
  COMMON+=(--model.torch_compile false --data.compile_augment false --trainer.precision 32-true --data.train_subset 2048
    --data.val_size 500 --data.batch_size 64 --model.network.depth 2 --model.network.embed_dim 64
    --model.network.num_heads 4)
fi
# the callbacks without the EMA and MixSchedule (a later -c replaces the whole list)
cat >"$WORK/no-ema-mix.yaml" <<'EOF'
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {monitor: val/acc, mode: max, save_last: true, save_on_train_epoch_end: false}
    - class_path: vit.train.callbacks.TimeBudget
      init_args: {minutes: 1.5}
model: {mixup_alpha: 0.0, cutmix_alpha: 0.0}
EOF
declare -A VARIANT=(
  [as-is]=""
  [no-cuda-graphs]="--model.compile_mode default"
  [no-device-data]="--data.device_data false"
  [no-ema-no-mix]="-c $WORK/no-ema-mix.yaml"
)
LIMIT_S=$($PY -c "print(int($MINUTES * 60 + 120))")  # the fit's budget, start-up and last save
NEED_S=$($PY -c "print(int($MINUTES * 60 + 40))")  # what a variant takes when nothing stalls
DEADLINE=${DEADLINE:-0}
for name in ${VARIANTS:-as-is no-cuda-graphs no-device-data no-ema-no-mix}; do
  [[ -v "VARIANT[$name]" ]] || { echo "unknown variant $name: ${!VARIANT[*]}" >&2; exit 2; }
  if ((DEADLINE)); then
    left=$((DEADLINE - $(date +%s)))
    if ((left < NEED_S)); then echo "=== $name: skipped, $left s left"; continue; fi
    ((left < LIMIT_S)) && LIMIT_S=$left
  fi
  echo "=== $name: ${VARIANT[$name]}"
  # shellcheck disable=SC2086  # the variant's words are separate arguments
  mkdir -p "$WORK/$name"
  (cd "$WORK/$name" && timeout -k 5 "$LIMIT_S" $PY -m vit.commands.entry "${COMMON[@]}" \
    ${VARIANT[$name]} --trainer.callbacks.init_args.minutes "$MINUTES" >log.txt 2>&1) ||
    echo "exit $? (tail below)"
  tail -3 "$WORK/$name/log.txt"
done
$PY - "$WORK" "$OUT/diagnose.json" <<'EOF'
import json, sys
from pathlib import Path
from scripts.gpu.summary import summarize  # the checkout is on PYTHONPATH
work, rows = Path(sys.argv[1]), {}
for run in sorted(work.glob("*/runs/gpu8/version_0")):
    try:
        s = summarize(run, None, "", 0)
        rows[run.parents[2].name] = {k: s[k] for k in ("steps", "fit_s", "off_schedule_clock_s",
                                                   "fit_img_s", "step_img_s")}
    except Exception as e:  # a variant that failed: say why, keep the others
        rows[run.parents[2].name] = {"error": repr(e)}
Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
print(json.dumps(rows, indent=1))
EOF
