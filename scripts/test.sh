#!/usr/bin/env bash
# Run the whole test suite (sets up .venv first). Extra arguments go to pytest.
# --fast (first argument): the fast tier only, -m "not slow" (tests that start no fresh process: a loop of minutes).
# Fails loudly when pytest collected no test (pytest exit code 5), so CI never passes silently.
set -uo pipefail
cd "$(dirname "$0")/.."
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not slow")
fi
bash scripts/setup.sh || exit 1
VENV="${NEURON_ARGS_VENV:-.venv}"
"$VENV/bin/python" -m pytest -p no:cacheprovider "${tier[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "ERROR: pytest collected no tests: the suite did not run" >&2
  exit 1
fi
exit "$rc"
