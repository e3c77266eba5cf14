#!/bin/bash
# One seed of experiments/gpu8.yaml on one GPU (issue 45): the 8-minute fit, the test split scored
# once (vit-evaluate, fp32, no flip, best-val checkpoint), and the result files in $OUT, in about
# 9 minutes (the fit capped at the budget + 55 s, evaluation at 40 s: under 600 s in all).
#   here, once per checkout:  bash scripts/gpu/run_gpu8.sh --prepare   (wheels, data copy)
#   on the device:            SEED=0 MINUTES=7.5 bash scripts/gpu/run_gpu8.sh  (run: timeout_s 600,
#                             carry [".whl", ".devdata"]); PROBE_S=60 first probes the bare step
#                             (then MINUTES=6.5 keeps the call under 600 s)
#   here, the plumbing only:  bash scripts/gpu/run_gpu8.sh --dry-run   (CPU, tiny, ~1.5 min;
#                             GUARD_FLOOR=1000 GUARD_AFTER_S=1 PROBE_S=6 adds the guard's path)
# With a probe, a fit whose loop runs under GUARD_FLOOR (0.25) of the probed step stops after
# GUARD_AFTER_S (30 s; scripts/gpu/slow_fit_guard.py), and diagnose_loop.sh's variants fill the
# time left: their img/s land in summary.json.
# The device's python3 has torch, lightning, torchmetrics, einops, tensorboard and matplotlib, but
# not jsonargparse (nor docstring_parser, typeshed_client): those travel as wheels in .whl/.
# $OUT gets 8 files (the device returns at most 8): log.txt, device.txt (nvidia-smi, versions),
# config.yaml, metrics.csv, metrics_test.json, curve.png + curve.csv (val/acc by minute), summary.json.
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
[[ $MODE == run || $MODE == --dry-run ]] || { echo "usage: $0 [--prepare|--dry-run]" >&2; exit 2; }

PY=${PYTHON:-python3}
if [[ $MODE == --dry-run ]]; then
  [[ -x $REPO/.venv/bin/python ]] && PY=${PYTHON:-$REPO/.venv/bin/python}
  OUT=${OUT:-$(mktemp -d /tmp/gpu8-out.XXXX)}
fi
: "${OUT:?set OUT to the folder the result files go to}"
WORK=$(mktemp -d /tmp/gpu8.XXXX)  # the run folders; $OUT holds only what comes back
if [[ $MODE == --dry-run ]]; then trap 'rm -rf "$WORK"' EXIT; fi
export PYTHONUNBUFFERED=1
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
if ! $PY -c "import torch, lightning, torchmetrics, einops, safetensors, jsonargparse, \
docstring_parser, typeshed_client, tensorboard, matplotlib, PIL"; then
  echo "missing packages (above): run '$0 --prepare' on the CPU machine and carry .whl" >&2
  exit 2
fi

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

{ nvidia-smi && nvidia-smi -L || echo "nvidia-smi: not available"; lscpu | grep -m1 "Model name"
  $PY -c "import torch, lightning, torchmetrics as m; print('torch', torch.__version__, 'lightning', \
lightning.__version__, 'torchmetrics', m.__version__)"; } >"$OUT/device.txt" 2>&1 || true
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
CARD=${CARD:-CPU}
cat "$OUT/device.txt"

MINUTES=${MINUTES:-8.0}  # the device call may want less: setup took ~50 s of its 600
ARGS=(fit -c "$REPO/experiments/gpu8.yaml" --seed_everything "$SEED" --data.seed "$SEED"
  --data.data_dir "$DATA" --trainer.callbacks.init_args.minutes "$MINUTES")
if [[ $MODE == --dry-run ]]; then  # a CPU: no compiler run, float32, a 6-s budget, a tiny model
  MINUTES=0.1
  ARGS+=(--trainer.callbacks.init_args.minutes "$MINUTES" --model.torch_compile false --data.compile_augment false
    --trainer.precision 32-true --data.train_subset 2048 --data.val_size 500
    --data.batch_size 64 --data.num_workers 0 --trainer.log_every_n_steps 1 --model.network.depth 2
    --model.network.embed_dim 64 --model.network.num_heads 4)
fi
FIT_S=$($PY -c "print(int($MINUTES * 60 + 55))")

PROBE_S=${PROBE_S:-0}  # seconds of bare-step probe before the fit (scripts/gpu/probe.py); 0: none
if [[ $PROBE_S != 0 ]]; then
  stamp "probe: $PROBE_S s of bare steps"
  PROBE_ARGS=(--seconds "$PROBE_S" --out "$WORK/probe.json")
  [[ $MODE == --dry-run ]] && PROBE_ARGS+=(--device cpu --batch 16 --tiny)
  timeout -k 5 $((PROBE_S + 60)) $PY "$REPO/scripts/gpu/probe.py" "${PROBE_ARGS[@]}" || true
fi

# a loop far below the bare step (the first H100 fit: 67x) stops after 30 s, and the call's
# time left goes to diagnose_loop.sh's variants; GUARD_FLOOR=0: no guard
GUARD_FLOOR=${GUARD_FLOOR:-0.25}  # the share of probe.py's whole step worth finishing
GUARD_AFTER_S=${GUARD_AFTER_S:-30}  # at 1/67 of the step, 30 s tell; two variants then fit
MIN_IMG_S=""
if [[ -f $WORK/probe.json && $GUARD_FLOOR != 0 ]]; then
  MIN_IMG_S=$($PY -c "import json, sys; p = json.load(open(sys.argv[1])); \
print(max(1, round($GUARD_FLOOR * p['+ augment + EMA']['img_s'])))" "$WORK/probe.json" || true)
fi
if [[ -n $MIN_IMG_S ]]; then  # after every --trainer.callbacks.init_args override of the budget
  export PYTHONPATH=$PYTHONPATH:$REPO/scripts/gpu  # by module name: no package "scripts" to find
  ARGS+=(--trainer.callbacks+=slow_fit_guard.SlowFitGuard
    --trainer.callbacks.init_args.min_img_s "$MIN_IMG_S"
    --trainer.callbacks.init_args.report "$WORK/loop_check.json"
    --trainer.callbacks.init_args.after_s "$GUARD_AFTER_S")
fi

stamp "fit: $CARD, seed $SEED, budget $MINUTES min, killed after $FIT_S s\
${MIN_IMG_S:+, stopped if its loop runs under $MIN_IMG_S img/s}"
(while sleep 30; do cp "$WORK"/runs/gpu8/version_0/metrics.csv "$OUT/" 2>/dev/null || true; done) &
COPIER=$!
FIT_RC=0
(cd "$WORK" && timeout -k 5 "$FIT_S" $PY -m vit.commands.entry "${ARGS[@]}") || FIT_RC=$?
kill "$COPIER" 2>/dev/null || true
RUN=$WORK/runs/gpu8/version_0
cp "$RUN/config.yaml" "$RUN/metrics.csv" "$OUT/" || true
stamp "fit ended, exit $FIT_RC"

CKPT=$(ls "$RUN"/checkpoints/best-*.ckpt 2>/dev/null | tail -1 || true)
CKPT=${CKPT:-$RUN/checkpoints/last.ckpt}
EVAL_RC=0
timeout -k 5 40 $PY -c "from vit.commands.entry import evaluate; evaluate()" "$CKPT" --split test --no-flip \
  --data-dir "$DATA" --output-dir "$WORK/test" || EVAL_RC=$?
cp "$WORK/test/metrics_test.json" "$OUT/" || true
stamp "evaluate ($CKPT), exit $EVAL_RC"

DIAG=(--attach "loop_check=$WORK/loop_check.json")  # the guard's check, if it got that far
if grep -qs '"stopped": true' "$WORK/loop_check.json"; then  # why is the loop slow?
  stamp "the guard stopped the fit: $(cat "$WORK/loop_check.json"); diagnose_loop.sh next"
  DIAG_ARGS=(); [[ $MODE == --dry-run ]] && DIAG_ARGS=(--dry-run)
  # each variant starts only if it can end by the deadline: the call's 600 s less the files' 25
  DEADLINE=$((T0 + ${CALL_S:-590} - 25)) VARIANTS="no-cuda-graphs no-device-data no-ema-no-mix" \
    MINUTES=${DIAG_MINUTES:-1.5} OUT=$WORK/diagnose PYTHON=$PY \
    bash "$REPO/scripts/gpu/diagnose_loop.sh" "${DIAG_ARGS[@]}" || true
  DIAG+=(--attach "diagnose=$WORK/diagnose/diagnose.json")
fi

$PY "$REPO/scripts/plot_curve.py" "$RUN" --labels "gpu8.yaml, $CARD, seed $SEED" \
  --title "gpu8.yaml: val/acc in an $MINUTES-minute fit" --out "$OUT/curve.png" || true
$PY "$REPO/scripts/gpu/summary.py" "$RUN" --test "$OUT/metrics_test.json" --card "$CARD" \
  --fit-exit "$FIT_RC" --probe "$WORK/probe.json" "${DIAG[@]}" --out "$OUT/summary.json" || true
stamp end
ls -l "$OUT"
[[ $FIT_RC == 0 && $EVAL_RC == 0 ]]
