"""What ``--neuron-tp`` rank processes hand back, read bounded and checked (a rank process is not trusted): digests
of each rank's weights (``assert_ranks(N)`` refuses a model that ignores its rank), what it warmed
(``rank<rank>.json``) and a serving test's outcome, phase by phase (``serve<rank>.json``).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from neuron_args import envs
from neuron_args.atomic import write_atomic
from neuron_args.untrusted import RECORD_LIMIT, read_json

SAMPLE = 4096  # elements hashed per tensor: enough to tell shards apart, cheap for a large model


def weights_digest(model: Any) -> dict[str, str]:
    """Digests of ``model``'s parameters and buffers: ``layout`` (names, shapes, dtypes) and ``values`` (the
    layout and a strided sample of every tensor's values)."""
    import torch

    layout, values = hashlib.sha256(), hashlib.sha256()
    state = model.state_dict() if isinstance(model, torch.nn.Module) else {}
    for name in sorted(state):
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        text = f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode()
        layout.update(text)
        values.update(text)
        flat = tensor.detach().reshape(-1)
        if flat.numel() and flat.device.type != "meta":
            sample = flat[::max(1, flat.numel() // SAMPLE)][:SAMPLE].contiguous().cpu()
            values.update(sample.view(torch.uint8).numpy().tobytes())
    return {"layout": layout.hexdigest()[:16], "values": values.hexdigest()[:16]}


def unsharded_reason(rank_weights: dict[int, dict[str, str]], single_layout: str | None) -> str | None:
    """Why these ranks' models look like no shard (None when they look sharded): every rank holds the weights
    of the model built outside a tensor-parallel group, or all ranks hold byte-identical weights."""
    if len(rank_weights) < 2:
        return None
    layouts = {w.get("layout") for w in rank_weights.values()}
    if single_layout is not None and layouts == {single_layout}:
        return ("every rank holds weights of the same names and shapes as the model built outside a "
                "tensor-parallel group (the pytest process's)")
    if len({w.get("values") for w in rank_weights.values()}) == 1:
        return "every rank holds byte-identical weights"
    return None


def _read_object(path: Path) -> dict[str, Any]:
    """A rank's file as a JSON object, bounded; ``{}`` for a missing, unreadable, oversized or non-object file."""
    try:
        doc = read_json(path, RECORD_LIMIT)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def warmup_file(out: Path, rank: int) -> Path:
    return out / f"rank{rank}.json"


def serve_file(out: Path, rank: int) -> Path:
    return out / f"serve{rank}.json"


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, default=str))  # a link planted at the path is replaced, not followed


def write_warmup(out: Path, result: dict[str, Any]) -> None:
    """In a rank process: what its warmup did (or why it failed), for :func:`read_warmups`."""
    _write(warmup_file(out, envs.RANK), {**result, "rank": envs.RANK})


def read_warmups(out: Path, tp: int) -> list[dict[str, Any]]:
    """Each rank's ``rank<rank>.json``, typed (untrusted): ``graphs`` a list only when reported, ``error`` a string
    or None, ``export``/``weights``/``config`` dicts or None."""
    return [{"rank": rank, "error": str(doc["error"]) if doc.get("error") else None,
             "graphs": doc["graphs"] if isinstance(doc.get("graphs"), list) else None,
             **{k: doc[k] if isinstance(doc.get(k), dict) else None for k in ("export", "weights", "config")}}
            for rank, doc in enumerate(_read_object(warmup_file(out, r)) for r in range(tp))]


def note_phase(out: Path, report: Any, export: dict[str, Any]) -> None:
    """In a rank running a serving test: its outcome so far (a failed phase wins) and what it served."""
    path = serve_file(out, envs.RANK)
    result = _read_object(path)
    if not result or result.get("outcome") not in (None, "passed", "failed", "skipped"):
        result = {"rank": envs.RANK, "outcome": None, "error": None}
    if report.failed and result["outcome"] != "failed":  # the first failure is the one to show
        result["outcome"], result["error"] = "failed", f"{report.when}: {report.longrepr}"
    elif report.skipped and result["outcome"] is None:
        result["outcome"], result["error"] = "skipped", str(report.longrepr)
    elif report.when == "call" and result["outcome"] is None:
        result["outcome"] = "passed"
    _write(path, {**result, "export": export})


def read_serves(out: Path, tp: int) -> list[dict[str, Any]]:
    """Each rank's ``serve<rank>.json`` (untrusted: a rank that wrote nothing or garbage has outcome None)."""
    results = []
    for rank in range(tp):
        doc = _read_object(serve_file(out, rank))
        export = doc.get("export") if isinstance(doc.get("export"), dict) else {}
        calls = export.get("serve_calls") if isinstance(export.get("serve_calls"), dict) else {}
        results.append({"rank": rank, "outcome": doc.get("outcome") if isinstance(doc.get("outcome"), str) else None,
                        "error": str(doc["error"]) if doc.get("error") else None,
                        "serve_calls": sum(_count(n) for n in calls.values()),
                        "serve_misses": _count(export.get("serve_misses")), "export": export})
    return results


def _count(value: Any) -> int:
    """A count read from a rank's file: a non-negative int, anything else (a string, a float, a bool) is 0."""
    return value if type(value) is int and value >= 0 else 0


def rank_line(r: dict[str, Any]) -> str:
    """``rank 1 failed (3 calls, 1 miss)``: one rank's result as the summary and failures say it."""
    outcome = r.get("outcome") or "reported nothing"
    return f"rank {r['rank']} {outcome} ({r.get('serve_calls', 0)} calls, {r.get('serve_misses', 0)} misses)"


def serve_problems(results: list[dict[str, Any]]) -> list[str]:
    """Why a serving test failed across its ranks (empty: every rank passed with no miss)."""
    out = []
    for r in results:
        if r["outcome"] in ("failed", None):
            out.append(f"{rank_line(r)}" + (f":\n{r['error']}" if r.get("error") else
                                            ": its output is in the captured stdout"))
        elif r["serve_misses"]:
            out.append(f"{rank_line(r)}: a served call missed the cache (the test caught the CacheMissError)")
    skipped = [r for r in results if r["outcome"] == "skipped"]
    if skipped and len(skipped) < len(results):
        out += [f"{rank_line(r)}, while other ranks ran it: {r.get('error') or ''}" for r in skipped]
    return out


__all__ = ["note_phase", "rank_line", "read_serves", "serve_file", "serve_problems", "unsharded_reason", "weights_digest"]
