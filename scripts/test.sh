#!/usr/bin/env bash
# Run the whole test suite (sets up .venv first) on 2 xdist workers, one test file per worker at a time
# (--dist loadfile: a file's module fixtures are built once). Extra arguments go to pytest; give -n yourself
# (-n 0: one process) to choose otherwise.
# --fast (first argument): the fast tier only, -m "not slow" (tests that start no fresh process: a loop of minutes).
# Fails loudly when pytest collected no test (pytest exit code 5), so CI never passes silently.
set -uo pipefail
cd "$(dirname "$0")/.."
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not slow")
fi
workers=(-n 2 --dist loadfile)
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses|--numprocesses=*|no:xdist) workers=() ;; esac
done
bash scripts/setup.sh || exit 1
VENV="${NEURON_ARGS_VENV:-.venv}"
"$VENV/bin/python" -m pytest -p no:cacheprovider "${workers[@]}" "${tier[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "ERROR: pytest collected no tests: the suite did not run" >&2
  exit 1
fi
exit "$rc"
