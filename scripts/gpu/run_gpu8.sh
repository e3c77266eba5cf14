#!/bin/bash
# One seed of experiments/gpu8.yaml on one GPU (issues 45, 60): the fit, the test split scored once
# (vit-evaluate, fp32, no flip, best-val checkpoint), and the result files in $OUT, in one device
# call that plans to end by +END_S (560 s) of its CALL_S (600):
#   here, once per checkout:  bash scripts/gpu/run_gpu8.sh --prepare   (wheels, data copy)
#   on the device:            SEED=0 bash scripts/gpu/run_gpu8.sh  (run: timeout_s 600,
#                             carry [".whl", ".devdata"])
#   here, the plan:           SETUP_S=36 bash scripts/gpu/run_gpu8.sh --plan   (prints the timeline)
#   here, the plumbing only:  bash scripts/gpu/run_gpu8.sh --dry-run   (CPU, tiny, ~1.5 min;
#                             GUARD_MIN_IMG_S=100000 GUARD_AFTER_S=1 takes the fallback's path)
# MINUTES (default auto): the fit's budget; auto is what the plan leaves after the setup, at most 8.
# The plan's other parts are the 2026-11-29 H200 call's stamps, rounded up: the fit's process
# beyond its budget (start-up, last validation and save) FIT_EXTRA_S, the evaluation EVAL_S, the
# plot and summary FILES_S. Hard limits keep the call under CALL_S whatever runs long: the fit is
# killed at its budget + 55 s or where only the evaluation's 40 s and the files' are left.
# The loop's check (scripts/gpu/slow_fit_guard.py): GUARD_AFTER_S (30) seconds after the first
# step, a loop under GUARD_MIN_IMG_S (5,000; 0: no check) img/s stops the fit, which is not scored;
# one fit with --model.compile_mode default (no CUDA graphs) takes the time left instead.
# The device's python3 has torch, lightning, torchmetrics, einops, tensorboard and matplotlib, but
# not jsonargparse (nor docstring_parser, typeshed_client): those travel as wheels in .whl/.
# $OUT gets 8 files (the device returns at most 8): log.txt (nvidia-smi and the versions at its
# head), config.yaml, metrics.csv, metrics_test.json, curve.png + curve.csv (val/acc by minute),
# summary.json, and model.safetensors: the scored checkpoint's weights as save_pretrained writes
# them (11 MB; a run worth shipping needs no second GPU call).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODE=${1:-run}
SEED=${SEED:-0}
ARCHIVE=cifar10-jpeg.tar.gz
SHA=b2ef0ba2f327c7df6d184bf91142bb60a55af08d4009c0a04237bdddeb5d9a49  # ../shared/data/README.md

if [[ $MODE == --prepare ]]; then  # on the CPU machine: what the device cannot fetch
  cd "$REPO" && mkdir -p .git/info .whl .devdata && touch .git/info/exclude
  for p in /.whl/ /.devdata/; do grep -qxF "$p" .git/info/exclude || echo "$p" >>.git/info/exclude; done
  PIP_PY=python3; [[ -x .venv/bin/python ]] && PIP_PY=.venv/bin/python
  $PIP_PY -m pip download -q --no-deps --only-binary=:all: -d .whl \
    jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0
  cp -f ../shared/data/$ARCHIVE .devdata/ && ls -l .whl .devdata
  exit 0
fi
CALL_S=${CALL_S:-600} END_S=${END_S:-560}
FIT_EXTRA_S=${FIT_EXTRA_S:-35} EVAL_S=${EVAL_S:-25} FILES_S=${FILES_S:-10}
plan_minutes() {  # $1: seconds gone; the budget that ends the plan by END_S, at most 8 minutes
  local left=$((END_S - $1 - FIT_EXTRA_S - EVAL_S - FILES_S))
  ((left < 60)) && { echo 0; return; }
  python3 -c "print(min(8.0, int($left / 6) / 10))"  # tenths of a minute, rounded down
}
if [[ $MODE == --plan ]]; then  # the timeline, from a setup time (the 2026-11-29 H200 call: 36 s)
  SETUP_S=${SETUP_S:-36}
  M=$(plan_minutes "$SETUP_S")
  FIT=$(python3 -c "print(round($M * 60))")
  echo "setup $SETUP_S s + fit ${M} min ($FIT s) + $FIT_EXTRA_S s + evaluation $EVAL_S s + files $FILES_S s" \
    "= $((SETUP_S + FIT + FIT_EXTRA_S + EVAL_S + FILES_S)) s (plan's end $END_S, call $CALL_S)"
  exit 0
fi
[[ $MODE == run || $MODE == --dry-run ]] || { echo "usage: $0 [--prepare|--plan|--dry-run]" >&2; exit 2; }

PY=${PYTHON:-python3}
if [[ $MODE == --dry-run ]]; then
  [[ -x $REPO/.venv/bin/python ]] && PY=${PYTHON:-$REPO/.venv/bin/python}
  OUT=${OUT:-$(mktemp -d /tmp/gpu8-out.XXXX)}
fi
: "${OUT:?set OUT to the folder the result files go to}"
WORK=$(mktemp -d /tmp/gpu8.XXXX)  # the run folders; $OUT holds only what comes back
if [[ $MODE == --dry-run ]]; then trap 'rm -rf "$WORK"' EXIT; fi
export PYTHONUNBUFFERED=1
[[ $MODE == run ]] && export TORCH_LOGS=${TORCH_LOGS-recompiles}  # a recompile mid-fit shows
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
stamp() { echo "=== $1 at +$(($(date +%s) - T0)) s"; }

if [[ $MODE == run ]]; then
  if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$REPO"/.whl/*.whl
    export PYTHONPATH=/tmp/site
  fi
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}  # no install: an editable one took ~20 s
DATA=""
for place in "${VIT_DATA_DIR:-}" "$REPO/.devdata/$ARCHIVE" "$REPO/shared/data/$ARCHIVE" \
  "$REPO/../shared/data/$ARCHIVE"; do
  if [[ -n $place && -e $place ]]; then DATA=$place; break; fi
done
if [[ -z $DATA ]]; then
  echo "CIFAR-10 not found at \$VIT_DATA_DIR, .devdata/, shared/data/ or ../shared/data/" \
    "($ARCHIVE): run '$0 --prepare' on the CPU machine and carry .devdata" >&2
  exit 2
fi
if [[ -f $DATA && $(sha256sum "$DATA" | cut -d' ' -f1) != "$SHA" ]]; then
  echo "$DATA is not the known copy (sha256 differs from $SHA)" >&2
  exit 2
fi

# the import check and the versions in one start of python: each start imports torch (seconds)
{ nvidia-smi && nvidia-smi -L || echo "nvidia-smi: not available"; lscpu | grep -m1 "Model name"; } \
  >"$WORK/device.txt" 2>&1 || true
if ! $PY -c "import torch, lightning, torchmetrics as m, einops, safetensors, jsonargparse, \
docstring_parser, typeshed_client, tensorboard, matplotlib, PIL; print('torch', torch.__version__, \
'lightning', lightning.__version__, 'torchmetrics', m.__version__)" >>"$WORK/device.txt"; then
  echo "missing packages (above): run '$0 --prepare' on the CPU machine and carry .whl" >&2
  exit 2
fi
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
CARD=${CARD:-CPU}
cat "$WORK/device.txt"  # into log.txt

ARGS=(fit -c "$REPO/experiments/gpu8.yaml" --seed_everything "$SEED" --data.seed "$SEED"
  --data.data_dir "$DATA")
if [[ $MODE == --dry-run ]]; then  # a CPU: no compiler run, float32, a tiny model
  ARGS+=(--model.torch_compile false --data.compile_augment false
    --trainer.precision 32-true --data.train_subset 2048 --data.val_size 500
    --data.batch_size 64 --data.num_workers 0 --trainer.log_every_n_steps 1 --model.network.depth 2
    --model.network.embed_dim 64 --model.network.num_heads 4)
fi
GUARD_MIN_IMG_S=${GUARD_MIN_IMG_S:-5000}  # the first H100 fit's loop: 352; the fixed one: 21,505
GUARD_AFTER_S=${GUARD_AFTER_S:-30}  # from the end of the first step (its recordings behind it)
GUARD=()
if [[ $GUARD_MIN_IMG_S != 0 ]]; then
  export PYTHONPATH=$PYTHONPATH:$REPO/scripts/gpu  # by module name: no package "scripts" to find
  GUARD=(--trainer.callbacks+=slow_fit_guard.SlowFitGuard
    --trainer.callbacks.init_args.min_img_s "$GUARD_MIN_IMG_S"
    --trainer.callbacks.init_args.report "$WORK/loop_check.json"
    --trainer.callbacks.init_args.after_s "$GUARD_AFTER_S")
fi

# fit NAME MINUTES CHECK [ARGS...]: one fit in $WORK/NAME, its budget MINUTES, the loop's check
# if CHECK is 1; sets FIT_RC and RUN
fit() {
  local name=$1 minutes=$2 check=$3 gone kill_s
  shift 3
  local guard=()
  [[ $check == 1 ]] && guard=("${GUARD[@]}")
  gone=$(($(date +%s) - T0))
  # the budget + 55 s, but no later than leaves the evaluation's 40 s and the files' in the call
  kill_s=$(python3 -c "print(min(int($minutes * 60 + 55), $CALL_S - $gone - 40 - $FILES_S))")
  stamp "fit $name: $CARD, seed $SEED, budget $minutes min, killed after $kill_s s${*:+, with $*}"
  mkdir -p "$WORK/$name"
  RUN=$WORK/$name/runs/gpu8/version_0
  (while sleep 30; do cp "$RUN/metrics.csv" "$OUT/" 2>/dev/null || true; done) &
  local copier=$!
  FIT_RC=0
  # the budget before the guard joins: --trainer.callbacks.init_args sets the list's last one
  (cd "$WORK/$name" && timeout -k 5 "$kill_s" $PY -m vit.commands.entry "${ARGS[@]}" "$@" \
    --trainer.callbacks.init_args.minutes "$minutes" "${guard[@]}") || FIT_RC=$?
  kill "$copier" 2>/dev/null || true
  cp "$RUN/config.yaml" "$RUN/metrics.csv" "$OUT/" || true
  stamp "fit $name ended, exit $FIT_RC"
}

MINUTES=${MINUTES:-auto}
[[ $MODE == --dry-run ]] && MINUTES=0.1  # 6 s
if [[ $MINUTES == auto ]]; then
  MINUTES=$(plan_minutes $(($(date +%s) - T0)))
  ((${MINUTES%.*} > 0)) || { echo "the setup left no time for a fit" >&2; exit 1; }
fi
stamp "plan: fit $MINUTES min + ~$FIT_EXTRA_S s, evaluation ~$EVAL_S s, files ~$FILES_S s: \
ends near +$END_S s of $CALL_S"
fit main "$MINUTES" 1
STOPPED_RUN=""
if grep -qs '"stopped": true' "$WORK/loop_check.json"; then  # a slow loop: CUDA graphs off
  stamp "the loop check stopped the fit: $(cat "$WORK/loop_check.json")"
  STOPPED_RUN=$RUN
  LEFT=$(plan_minutes $(($(date +%s) - T0)))
  [[ $MODE == --dry-run ]] && LEFT=0.1
  if [[ $LEFT != 0 ]]; then
    fit fallback "$LEFT" 0 --model.compile_mode default  # runs to its end: no second check
    MINUTES=$LEFT
  else
    RUN=""
    stamp "no time left for a fallback fit"
  fi
fi

SCORE_AND_SAVE='import json, os, sys
from vit.commands.entry import evaluate
evaluate()  # sys.argv[1:]: the checkpoint and the options
from vit.io.hub import save_pretrained
top1 = json.load(open(os.path.join(os.environ["SCORED"], "metrics_test.json")))["top1"]
save_pretrained(sys.argv[1], os.environ["SAVE_TO"], metadata={"test_top1": str(top1),
    "recipe": "experiments/gpu8.yaml", "trained_on": os.environ["CARD"],
    "command": "SEED=" + os.environ["SEED"] + " bash scripts/gpu/run_gpu8.sh"})'
EVAL_RC=0
CKPT=""
if [[ -n $RUN ]]; then  # a fit the check stopped is not scored
  CKPT=$(ls "$RUN"/checkpoints/best-*.ckpt 2>/dev/null | tail -1 || true)
  CKPT=${CKPT:-$RUN/checkpoints/last.ckpt}
  # the scored weights saved in the same python (torch imported once): model.safetensors
  SCORED=$WORK/test SAVE_TO=$WORK/pretrained CARD=$CARD SEED=$SEED timeout -k 5 40 $PY \
    -c "$SCORE_AND_SAVE" "$CKPT" --split test --no-flip --data-dir "$DATA" --output-dir "$WORK/test" \
    || EVAL_RC=$?
  cp "$WORK/test/metrics_test.json" "$WORK/pretrained/model.safetensors" "$OUT/" || true
  stamp "evaluate ($CKPT), exit $EVAL_RC"
fi

ATTACH=(--attach "loop_check=$WORK/loop_check.json")  # the check, if it got that far
if [[ -n $STOPPED_RUN ]]; then
  $PY "$REPO/scripts/gpu/summary.py" "$STOPPED_RUN" --card "$CARD" --out "$WORK/stopped.json" \
    >/dev/null || true
  ATTACH+=(--attach "stopped_fit=$WORK/stopped.json")
fi
if [[ -n $RUN ]]; then
  LABEL="gpu8.yaml, $CARD, seed $SEED${STOPPED_RUN:+, compile_mode default}"
  $PY "$REPO/scripts/plot_curve.py" "$RUN" --labels "$LABEL" \
    --title "gpu8.yaml: val/acc in an $MINUTES-minute fit" --out "$OUT/curve.png" || true
  $PY "$REPO/scripts/gpu/summary.py" "$RUN" --test "$OUT/metrics_test.json" --card "$CARD" \
    --fit-exit "$FIT_RC" "${ATTACH[@]}" --out "$OUT/summary.json" || true
else
  $PY "$REPO/scripts/gpu/summary.py" "$STOPPED_RUN" --card "$CARD" --fit-exit "$FIT_RC" \
    "${ATTACH[@]}" --out "$OUT/summary.json" || true
fi
stamp end
ls -l "$OUT"
[[ -z $STOPPED_RUN && $FIT_RC == 0 && $EVAL_RC == 0 ]]
