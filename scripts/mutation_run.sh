#!/bin/bash
# The mutation run over the code that decides results (pyproject.toml's [tool.mutmut]: the files,
# and the tests used): mutmut 3 generates every small change, runs the tests that reach each
# changed function, and keeps each outcome in mutants/ (git-ignored), so a stopped run resumes
# where it stopped and a rerun after an edit retests only what changed. Hours on 2 cores: run it
# in the background, then write the table:
#   nohup bash scripts/mutation_run.sh > /tmp/mutation.log 2>&1 &
#   bash scripts/mutation_run.sh vit.model.attention    # one module (a mutant-name prefix)
#   python scripts/mutation_table.py                    # experiments/record/mutations/mutmut.md
# Why mutmut and not cosmic-ray: mutmut maps each function to the tests that call it and forks
# per mutant from a warm interpreter, so a mutant costs its few tests, not the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=mutmut
[[ -x .venv/bin/mutmut ]] && MUTMUT=.venv/bin/mutmut
if ! command -v "$MUTMUT" >/dev/null; then
  echo "mutmut is not installed: pip install -e '.[mutation]'" >&2
  exit 2
fi
export VIT_HYPOTHESIS_PROFILE=mutation  # tests/conftest.py: no shrinking of failing examples
# one thread per test process: a child forked from a process whose OpenMP pool had run hung
# until mutmut's CPU-time limit killed it (a false "timeout" for most mutants)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# mutmut copies vit/'s Python files again when they change, but not its other files: the
# explorer page's assets went stale in mutants/ and its browser test failed mutmut's stats run
if [[ -d mutants/vit ]]; then
  (cd vit && find . -type f ! -name '*.py' ! -path '*/__pycache__/*' -exec cp --parents {} ../mutants/vit/ \;)
fi
if [[ $# -gt 0 ]]; then
  for prefix in "$@"; do nice -n 5 "$MUTMUT" run "$prefix*"; done
else
  nice -n 5 "$MUTMUT" run
fi
