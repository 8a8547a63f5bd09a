#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install everything it needs.
# Idempotent: re-runs pip only when pyproject.toml changed since the last successful set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${NEURON_ARGS_VENV:-.venv}"
stamp="$VENV/.neuron-args-setup"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setting up $VENV (torch 2.13 CPU, torchax, jax[cpu], the project) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
"$VENV/bin/python" -m pip install -q -e ".[hf,farm,plot,s3,test]" >&2
echo "$want" > "$stamp"
