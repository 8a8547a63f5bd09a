#!/usr/bin/env bash
# The main job: an example model through warmup and serve on the embedded local compiler
# (sets up .venv first). `--model tiny-vlm` (default) or `--model hf-llama` (a transformers Llama);
# other arguments go to that model's main (--flow parallel, --out DIR, default neuron-args-run/<model>; tiny-vlm
# also --tp 2, --dp 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${NEURON_ARGS_VENV:-.venv}"
model="tiny-vlm"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="${2:?--model needs a value: tiny-vlm or hf-llama}"; shift 2 ;;
    --model=*) model="${1#--model=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$model" in
  tiny-vlm) module=examples.tiny_vlm.main ;;
  hf-llama) module=examples.hf_llama.main ;;
  *) echo "main.sh: unknown --model '$model' (tiny-vlm or hf-llama)" >&2; exit 2 ;;
esac
exec "$VENV/bin/python" -m "$module" ${args[@]+"${args[@]}"}
