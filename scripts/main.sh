#!/usr/bin/env bash
# The main job: the example model through warmup and serve on the embedded local compiler
# (sets up .venv first). Extra arguments go to `python -m examples.tiny_vlm.main` (--flow parallel, --tp 2, --dp 2...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${NEURON_ARGS_VENV:-.venv}"
exec "$VENV/bin/python" -m examples.tiny_vlm.main "$@"
