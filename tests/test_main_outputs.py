"""Each model ``scripts/main.sh --model`` runs writes into its own default ``--out``: `--model hf-llama` once
wrote into the tiny VLM's folder and replaced its manifest."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_main_sh_model_has_its_own_default_out_folder():
    script = (REPO / "scripts" / "main.sh").read_text()
    modules = dict(re.findall(r"^\s*([a-z0-9-]+)\) module=([\w.]+) ;;$", script, flags=re.M))
    assert set(modules) == {"tiny-vlm", "hf-llama"}
    outs = {model: Path(importlib.import_module(module).parse_args([]).out) for model, module in modules.items()}
    assert len(set(outs.values())) == len(outs), outs
    for model, out in outs.items():  # no default folder holds another's (its manifests/ and cache/ inside)
        assert not any(other != out and (out in other.parents or other in out.parents) for other in outs.values())
        assert model in out.parts
