#!/bin/bash
# The numerical tests under each set of kernels a machine can be told to take, so that a bound
# fitted to one CPU kind shows before CI meets another kind: ATen's vector width (inductor
# honours it too), oneDNN's and MKL's instruction sets, and the MKL switch vit-train makes on AMD.
#   bash scripts/kernel_matrix.sh                      # every setting, table on stdout
#   bash scripts/kernel_matrix.sh avx2                 # the settings whose names are given
#   bash scripts/kernel_matrix.sh --list               # the settings' names
# Each setting gets its own inductor cache: torch 2.14's cache does not key its CPU kernels on
# ATEN_CPU_CAPABILITY, so a cache filled under one setting hands another its kernels (a C++
# compile error under `default`, NaN logits under `avx2`; experiments/record/kernels.md).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
# model, module, compile, optimizer, augmentation, maps, properties, resume, behaviour (the
# behaviour record's checks live in test_callbacks.py), EMA, attention, warm-up, shipped weights;
# then every other file that compares floats (a bound left out of the list is how the inspection
# test's float64 bound met MKL's AVX2 products only in a whole-suite run)
NUMERICAL=(
  tests/test_attention.py tests/test_model.py tests/test_module.py tests/test_compile.py
  tests/test_optim.py tests/test_augment.py tests/test_trivial_augment.py tests/test_maps.py
  tests/test_properties_model.py tests/test_properties_training.py tests/test_resume.py
  tests/test_callbacks.py tests/test_ema.py tests/test_warmup.py tests/test_shipped_weights.py
  tests/test_inspection.py tests/test_schedule.py tests/test_evaluate.py tests/test_predict.py
  tests/test_export.py tests/test_migrate.py tests/test_checkpoint.py tests/test_cifar100.py
  tests/test_cli.py tests/test_datamodule.py tests/test_ddp.py tests/test_folder_source.py
  tests/test_inspect_command.py tests/test_loggers.py tests/test_plot_curve.py
  tests/test_recipe_scripts.py tests/test_whole_split.py tests/test_ema_windows.py
  tests/test_eval_batch.py tests/test_visualize.py
)
declare -A SETTINGS=(
  [machine]=""
  [aten-default]="ATEN_CPU_CAPABILITY=default"
  [aten-avx2]="ATEN_CPU_CAPABILITY=avx2"
  [aten-avx512]="ATEN_CPU_CAPABILITY=avx512"
  [onednn-avx2]="ONEDNN_MAX_CPU_ISA=AVX2"
  [mkl-avx2]="MKL_ENABLE_INSTRUCTIONS=AVX2"
  [mkl-switch-off]="VIT_MKL_AVX2=0"
  [avx2-all]="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
)
ORDER=(machine aten-default aten-avx2 aten-avx512 onednn-avx2 mkl-avx2 mkl-switch-off avx2-all)
if [[ "${1:-}" == "--list" ]]; then
  for name in "${ORDER[@]}"; do echo "$name: ${SETTINGS[$name]:-(nothing set)}"; done
  exit 0
fi
[[ $# -gt 0 ]] && ORDER=("$@")
CACHES=$(mktemp -d)
trap 'rm -rf "$CACHES"' EXIT
KIND=$(lscpu | sed -n 's/^Model name: *//p')
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo)
ISA=avx2
[[ $FLAGS == *avx512f* ]] && ISA=avx512
[[ $FLAGS == *avx512_bf16* ]] && ISA=avx512bf16
[[ $FLAGS == *amx_bf16* ]] && ISA=amx
echo "CPU: $KIND ($ISA); commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'); $(date -u +%F)"
echo
echo "| setting | environment | result | seconds |"
echo "|---|---|---|---|"
status=0
for name in "${ORDER[@]}"; do
  [[ -v "SETTINGS[$name]" ]] || { echo "unknown setting $name (--list names them)" >&2; exit 2; }
  start=$SECONDS
  log="$CACHES/$name.log"
  env ${SETTINGS[$name]} TORCHINDUCTOR_CACHE_DIR="$CACHES/inductor-$name" \
    "$PY" -m pytest -q -p no:cacheprovider "${NUMERICAL[@]}" >"$log" 2>&1
  code=$?
  result=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -1 | tr -d '=')
  echo "| $name | \`${SETTINGS[$name]:-(none)}\` | ${result# } (exit $code) | $((SECONDS - start)) |"
  if [[ $code -ne 0 ]]; then
    status=1
    grep -E '^(FAILED|ERROR)' "$log" | sed 's/^/    /' >&2
  fi
done
exit $status
