"""What both main jobs print after serving, and the manifest check they share."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def validate(manifest: Path, cache_dir: Path) -> list[str]:
    """Schema check plus the cache cross-check the CLI's ``manifest validate`` does."""
    from neuron_args.manifest.schema import validate_manifest

    doc = json.loads(manifest.read_text())
    problems = validate_manifest(doc)
    for g in doc.get("graphs", []):
        neff = cache_dir / (g.get("neff_path") or "")
        if not neff.is_file() or neff.stat().st_size != g.get("neff_size"):
            problems.append(f"graph {g['graph_hash'][:12]}: executable missing or size differs in {cache_dir}")
    return problems


def report(say: Callable[..., Any], *, warm: Any, served: Any, tokens_match: bool, tokens: Any, reference: str,
           manifest: Path | None, cache_dir: Path) -> bool:
    """Print warmup, the per-graph table, serve, tokens and the manifest; True when all is well."""
    from neuron_args.seams import records

    say(f"\nwarmup: {warm.seconds:.1f}s, {warm.counts.compiles} compiled, {warm.counts.hits} from cache"
        f"{f', {warm.counts.captures} captured' if warm.counts.captures else ''}")
    say(records.table(records.records()))
    say(f"\nserve: {sum(served.calls.values())} graph calls, {served.counts.misses} cache misses, "
        f"{served.counts.compiles} compiles, {served.counts.hits} graphs re-resolved from the cache "
        "(NEURON_LIBTORCH_ASSERT_CACHE_HIT on)")
    say(f"tokens {'match' if tokens_match else 'DIFFER FROM'} {reference}: {tokens}")
    ok = tokens_match and served.counts.compiles == 0 and served.counts.misses == 0
    if manifest is not None:
        problems = validate(manifest, cache_dir)
        say(f"manifest: {manifest} ({'valid' if not problems else 'INVALID: ' + '; '.join(problems)})")
        ok = ok and not problems
    say(f"cache: {cache_dir}")
    return ok
