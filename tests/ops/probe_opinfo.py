"""Sweep torch's OpInfo database through the lowering: every op that supports float32 on CPU, its first samples
compiled (``fullgraph=True``, ``dynamic=False``, aot_autograd's forward lowered and run on XLA:CPU in-process, as
``tests/test_lowering_ops.py`` does) and compared with eager (atol = rtol = 1e-4 fp32, 2e-2 bf16; NaNs equal).

    .venv/bin/python -m tests.ops.probe_opinfo                   # the whole sweep; writes docs/OP_COVERAGE.md
    .venv/bin/python -m tests.ops.probe_opinfo cumsum gather     # some ops (their variants too), printed only
    .venv/bin/python -m tests.ops.probe_opinfo --rerun-failures  # the ops the last run did not pass, then the doc
    .venv/bin/python -m tests.ops.probe_opinfo --dtype bfloat16 --only-passed   # bf16, over the fp32 passes
    .venv/bin/python -m tests.ops.probe_opinfo --doc-only         # the doc from the cached results

Needs ``expecttest`` (torch's test helpers import it): ``.venv/bin/pip install expecttest``. Each op runs in one of
two worker processes (``--jobs``), with a timeout: a hang or a crash costs that op, not the sweep. Results are kept
per op in ``/tmp/neuron-args-opinfo/<dtype>.json`` (``--cache``), so a rerun only redoes what it is asked to.

One class per op (its worst sample):

- ``pass``: every sample equal to eager (random ops and uninitialized memory: shapes and dtypes only);
- ``not-ours``: Dynamo or aot_autograd refused it before the lowering saw a graph (a data-dependent output size
  Dynamo cannot trace, an op it does not support); with graph breaks allowed, the graphs it did make passed;
- ``refused``: our lowering refused it with the message naming the op and the fix (an output size that depends on
  tensor values, ...): a limit of static graphs;
- ``lowering-error``: our lowering raised otherwise (the aten op named);
- ``wrong``: the compiled result differs from eager's;
- ``crash``: XLA:CPU refused the HLO, the executable failed, the worker died or timed out.

Not a test: the suite keeps a parametrized test over the ops fixed after a sweep (``tests/test_lowering_ops.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "OP_COVERAGE.md"
CLASSES = ("pass", "not-ours", "refused", "lowering-error", "wrong", "crash")
#: a lowering error that is the project's refusal of an op a static graph cannot hold (it names the op and the fix)
REFUSAL = re.compile(r"depends on tensor values|which a static graph cannot|in eval mode only"
                     r"|Neuron graphs compute dense|which a Neuron graph cannot run")
TOL = {"float32": 1e-4, "bfloat16": 2e-2}
#: ops whose values are random draws or uninitialized memory: eager's numbers cannot be matched, shapes and dtypes can
UNCHECKED_VALUES = re.compile(
    r"^(bernoulli|normal|multinomial|uniform|cauchy|exponential|geometric|log_normal|rand\w*|new_empty\w*|empty\w*"
    r"|nn\.functional\.(dropout\w*|alpha_dropout|feature_alpha_dropout\w*|rrelu|fractional_max_pool\w*|gumbel_softmax)"
    r"|torch\.empty\w*|randint\w*|randn\w*|pca_lowrank|svd_lowrank)(\.|$)")

#: why an op that does not pass is left so (the doc's cause column; the first pattern matching the op's name wins)
NOTES = {
    r"^(float_power|(log_)?softmax\.with_dtype|nn\.functional\.softmin\.with_dtype)$": "computes in float64, which "
        "Neuron devices cannot (jax x64 is off): refused, naming the tensor and the fix (.float())",
    r"^matrix_exp$": "a matrix of 1-norm ~30 (entries ~1e5): fp32 rounding; the compiled result is closer to the "
                     "float64 one than eager's",
    r"^(nonzero|argwhere|masked_select|unique|unique_consecutive|combinations)$": "the output size depends on tensor "
                                                                                   "values: refused with the fix",
    r"^(narrow|tensor_split|item)$": "a Python number read from a tensor (.item()): refused, naming the read and the "
                                     "fix (the samples with Python ints pass)",
    r"^repeat_interleave$": "repeats given as a tensor without output_size: the size depends on the values (refused "
                            "with the fix); with output_size it lowers",
    r"^nn\.functional\.rrelu$": "training mode draws a random slope per element: refused with the fix (eval mode "
                                 "lowers)",
    r"^linalg\.ldl_solve$": "LAPACK-level factorization op no model calls (no lowering; the op named)",
    r"^hash_tensor$": "no lowering (the op named)",
    r"^chalf$": "complex32 has no XLA type (complex64 lowers)",
    r"^nn\.functional\.linear_cross_entropy\.chunked": "the opt-in chunked custom op (torch_nn namespace) has no "
                                                        "lowering; the default F.linear_cross_entropy lowers",
    r"^linalg\.vector_norm$": "ord=0 of a 0-d tensor: torchax reads the value into Python (other orders and shapes "
                              "pass)",
    r"^jiterator_": "CUDA-only",
    r"^(allclose|equal|cov|corrcoef)$": "Dynamo refuses a data-dependent Python value",
    r"^sparse\.|^to_sparse": "sparse tensors: Dynamo refuses them",
    r"^resize_": "Dynamo refuses resize_",
    r"^(linalg\.lstsq|nn\.functional\.ctc_loss)": "Dynamo refuses a dynamic-shape operator",
    # bfloat16 only (the float32 samples pass)
    r"^renorm$": "bfloat16 only: torch's decomposition (a float32 norm of the bfloat16 input) trips torchax's "
                 "environment check",
    r"^addbmm$": "bfloat16 only: one element of 50 off by 0.22 (eager is within 0.03 of float32 rounded once): the "
                 "graph rounds its batch sums differently from eager's kernel",
    r"^(grid_sampler_2d|nn\.functional\.grid_sample)$": "bfloat16 only: eager's CPU kernel rounds its intermediates "
                                                        "(grid coordinates) in bfloat16 its own way: eager itself is "
                                                        "up to 0.17 from float32 rounded once",
    r"^nn\.functional\.gaussian_nll_loss$": "Dynamo cannot guard on a data-dependent expression (a var shape check)",
}


def note(name: str) -> str:
    return next((text for pattern, text in NOTES.items() if re.search(pattern, name)), "")


# -- the worker: one op at a time, read from stdin, one JSON line per op on stdout


def full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _ops(dtype: Any) -> dict[str, Any]:
    import torch
    from torch.testing._internal import common_methods_invocations
    from torch.testing._internal.common_methods_invocations import op_db

    # random ops call their function through a wrapper that seeds torch's generator, which Dynamo will not trace
    common_methods_invocations.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)

    return {full_name(op): op for op in op_db if dtype in op.supported_dtypes("cpu")}


class Probe:
    """aot_autograd's forward compiler: lower, compile on XLA:CPU, run; remembers how far a graph got."""

    def __init__(self) -> None:
        self.phase = "dynamo"
        self.graphs = 0
        self.ops: list[str] = []

    def fw_compiler(self, gm: Any, example_inputs: list[Any]) -> Any:
        from neuron_args.lowering.hlo import lower_fx_graph
        from tests.xla_run import executable_runner

        self.graphs += 1
        self.ops += sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        self.phase = "lower"
        lowered = lower_fx_graph(gm, example_inputs)
        self.phase = "xla-compile"
        run = executable_runner(lowered)
        self.phase = "dynamo"

        def call(*args: Any) -> Any:
            self.phase = "run"
            out = run(*args)
            self.phase = "dynamo"
            return out

        call._boxed_call = False  # type: ignore[attr-defined]
        return call


def _clone(value: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


def _tensor_leaves(sample: Any) -> tuple[list[Any], Any, list[int]]:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
    return leaves, spec, [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]


def run_sample(op: Any, sample: Any, tol: float, fullgraph: bool, values: bool) -> tuple[str, str, list[str]]:
    """One sample: (class, detail, aten ops of the graphs)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec, positions = _tensor_leaves(sample)
    values = values and not _drops_out(sample)

    def fn(*tensors: Any) -> Any:
        items = list(leaves)
        for i, t in zip(positions, tensors):
            items[i] = t
        x, args, kwargs = tree_unflatten(items, spec)
        return op(x, *args, **kwargs)

    with torch.inference_mode():
        try:
            want = fn(*_clone([leaves[i] for i in positions]))
        except Exception as e:  # noqa: BLE001 - a sample eager refuses tells nothing about the lowering
            return "skip", f"eager raised {type(e).__name__}", []
        probe = Probe()
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=_aot(probe), fullgraph=fullgraph, dynamic=False)
        try:
            got = compiled(*_clone([leaves[i] for i in positions]))
        except Exception as e:  # noqa: BLE001 - classify every failure
            return _failure(probe, e), _first(e), probe.ops
    # what OpInfo compares (eigenvectors up to their sign: their absolute values)
    got, want = sample.output_process_fn_grad(got), sample.output_process_fn_grad(want)
    try:
        if values:
            torch.testing.assert_close(got, want, atol=tol, rtol=tol, equal_nan=True, check_stride=False)
        else:
            g, w = tree_flatten(got)[0], tree_flatten(want)[0]
            assert [(t.shape, t.dtype) for t in g if isinstance(t, torch.Tensor)] == \
                   [(t.shape, t.dtype) for t in w if isinstance(t, torch.Tensor)], "shapes or dtypes differ"
    except Exception as e:  # noqa: BLE001
        return "wrong", _first(e, 3), probe.ops
    if probe.graphs == 0:
        return "not-ours", "Dynamo made no graph (ran eagerly)", probe.ops
    return "pass", "", probe.ops


def _drops_out(sample: Any) -> bool:
    """The sample applies dropout (sdpa's ``dropout_p``, multi-head attention in training): random numbers."""
    kw = sample.kwargs
    return kw.get("dropout_p", 0) > 0 or (kw.get("training") is True and any(
        isinstance(a, float) and 0 < a < 1 for a in sample.args))


def _aot(probe: Probe) -> Any:
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=probe.fw_compiler)


def _failure(probe: Probe, e: BaseException) -> str:
    from neuron_args.errors import LoweringError

    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    if any(isinstance(c, LoweringError) for c in chain) or probe.phase == "lower":
        return "refused" if any(REFUSAL.search(str(c)) for c in chain) else "lowering-error"
    if probe.phase in ("xla-compile", "run"):
        return "crash"
    return "not-ours"


def _first(e: BaseException, lines: int = 1) -> str:
    """The error's first meaningful lines (for a lowering error: the one naming the op)."""
    from neuron_args.errors import LoweringError

    cause = e
    while cause is not None and not isinstance(cause, LoweringError):
        cause = cause.__cause__ or cause.__context__
    text = str(cause if cause is not None else e)
    kept = [t.strip() for t in text.strip().splitlines() if t.strip() and "raised:" not in t
            and not t.strip().startswith(("Set TORCH", "While executing", "Original traceback", "Explanation:",
                                           "Hint:", "Developer debug", "For more details", "from user code"))]
    return f"{type(cause if cause is not None else e).__name__}: {' | '.join(kept[:lines])}"[:400]


def probe_op(op: Any, dtype: Any, samples: int) -> dict[str, Any]:
    """Every sample (up to ``samples``) of one op: its class is the worst sample's."""
    name = full_name(op)
    tol = TOL[str(dtype).removeprefix("torch.")]
    values = not UNCHECKED_VALUES.match(name)
    results = []
    try:
        it = iter(op.sample_inputs("cpu", dtype))
        while len(results) < samples:
            try:
                sample = next(it)
            except StopIteration:
                break
            kind, detail, ops = run_sample(op, sample, tol, True, values)
            if kind == "not-ours":  # Dynamo refused one graph: lower the pieces it can make
                kind2, detail2, ops2 = run_sample(op, sample, tol, False, values)
                if kind2 not in ("pass", "not-ours"):
                    kind, detail, ops = kind2, f"{detail2} (with graph breaks; fullgraph: {detail})", ops2
            if kind != "skip":
                results.append((kind, detail, ops))
    except Exception as e:  # noqa: BLE001 - sample generation itself failed
        return {"op": name, "class": "not-ours", "detail": f"sample_inputs raised {_first(e)}", "samples": 0,
                "aten": []}
    if not results:
        return {"op": name, "class": "not-ours", "detail": "no sample eager runs", "samples": 0, "aten": []}
    worst = max(results, key=lambda r: _severity(r[0]))
    aten = sorted({o for r in results for o in r[2]})
    return {"op": name, "class": worst[0], "detail": worst[1] + ("" if values else " (values unchecked)"),
            "samples": len(results), "passed": sum(r[0] == "pass" for r in results), "aten": aten}


def _severity(kind: str) -> int:
    return {"pass": 0, "not-ours": 1, "refused": 2, "wrong": 3, "lowering-error": 4, "crash": 5}[kind]


def worker(dtype_name: str, samples: int) -> None:
    """Read op names from stdin; print one JSON result line per op."""
    import torch

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    torch._dynamo.config.suppress_errors = False
    dtype = getattr(torch, dtype_name)
    ops = _ops(dtype)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        t0 = time.time()
        try:
            result = probe_op(ops[name], dtype, samples)
        except BaseException as e:  # noqa: BLE001
            result = {"op": name, "class": "crash", "detail": f"probe raised {_first(e)}", "aten": [],
                      "trace": traceback.format_exc()[-600:]}
        result["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(result), flush=True)


# -- the parent: workers with timeouts, the result cache, the doc


class Worker:
    def __init__(self, dtype: str, samples: int) -> None:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHDYNAMO_VERBOSE": "0"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.ops.probe_opinfo", "--worker", "--dtype", dtype,
                                      "--samples", str(samples)], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.op: str | None = None
        self.started = 0.0
        self.ready = False

    def send(self, name: str) -> None:
        self.op, self.started = name, time.time()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def sweep(names: list[str], dtype: str, samples: int, jobs: int, timeout: float) -> dict[str, dict[str, Any]]:
    """Probe ``names`` on ``jobs`` workers; a worker that dies or passes ``timeout`` on one op is replaced."""
    todo, results = list(names), {}
    workers = [Worker(dtype, samples) for _ in range(min(jobs, len(todo)))]

    def replace(w: Worker, failure: str | None) -> None:
        """Stop ``w`` (its op, if any, crashed with ``failure``); start another while ops remain."""
        if w.op is not None and failure is not None:
            results[w.op] = {"op": w.op, "class": "crash", "detail": failure, "aten": []}
            _report(results[w.op], len(results), len(names))
        w.stop()
        workers.remove(w)
        if todo:
            workers.append(Worker(dtype, samples))

    while workers:
        for w in list(workers):
            if w.op is not None and time.time() - w.started > timeout:
                replace(w, f"timed out after {timeout:.0f}s")
        ready, _, _ = select.select([w.proc.stdout for w in workers], [], [], 1.0)
        for w in [w for w in workers if w.proc.stdout in ready]:
            line = w.proc.stdout.readline()
            if not line:  # the worker died
                replace(w, f"worker died (exit {w.proc.wait()})")
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # something the op printed
            if "op" in msg:
                results[msg["op"]] = msg
                _report(msg, len(results), len(names))
            if todo:
                w.send(todo.pop(0))
            else:
                w.stop()
                workers.remove(w)
    return results


def _report(r: dict[str, Any], done: int, total: int) -> None:
    print(f"[{done}/{total}] {r['op']}: {r['class']} {r.get('detail', '')[:200]}", flush=True)


def write_doc(results: dict[str, dict[str, Any]], dtype: str, samples: int,
              half: dict[str, dict[str, Any]] | None = None) -> None:
    import jax
    import torch

    from neuron_args.lowering.torchax_compat import import_torchax

    torchax = import_torchax()
    counts = Counter(r["class"] for r in results.values())
    total = len(results)
    lines = [
        "# Op coverage",
        "",
        f"Generated by `tests/ops/probe_opinfo.py` — do not edit by hand. Regenerate with "
        f"`.venv/bin/python -m tests.ops.probe_opinfo` (needs `pip install expecttest`; ~6 min on 2 quiet cores; "
        f"`--rerun-failures` redoes only the ops that did not pass). Run of {time.strftime('%Y-%m-%d')} with torch "
        f"{torch.__version__}, torchax {torchax.__version__}, jax {jax.__version__}.",
        "",
        f"Every OpInfo of torch's `op_db` that supports {dtype} on CPU ({total} ops and variants): its first "
        f"{samples} sample inputs, each compiled with `torch.compile(fullgraph=True, dynamic=False)` through "
        "aot_autograd, the forward graph lowered to HLO and run on XLA:CPU in-process, compared with eager "
        f"(atol = rtol = {TOL[dtype]:g}, NaNs equal, dtypes exact). An op's class is its worst sample's. "
        "Random draws and uninitialized memory (`rand*`, `normal`, `bernoulli`, dropout, `empty*`...) are "
        "checked for shapes and dtypes only. When Dynamo refuses one graph, the sample is retried with graph "
        "breaks allowed and the graphs Dynamo makes are lowered too.",
        "",
        "| class | ops | meaning |",
        "|---|---|---|",
    ]
    meaning = {
        "pass": "every sample equal to eager",
        "not-ours": "Dynamo or aot_autograd refused it before the lowering saw a graph (data-dependent output "
                    "sizes, ops Dynamo does not trace); with graph breaks, what it made passed",
        "refused": "our lowering refused it, naming the op and the fix: a limit of static graphs (an output size "
                   "that depends on tensor values)",
        "lowering-error": "our lowering raised otherwise (the aten op named)",
        "wrong": "the compiled result differs from eager's",
        "crash": "XLA:CPU refused the HLO, the executable failed, or the op timed out",
    }
    for c in CLASSES:
        lines.append(f"| {c} | {counts.get(c, 0)} | {meaning[c]} |")
    lines.append(f"| total | {total} | |")
    for c in CLASSES[1:]:
        rows = sorted((r for r in results.values() if r["class"] == c), key=lambda r: r["op"])
        if not rows:
            continue
        lines += ["", f"## {c} ({len(rows)})", "", "| op | why | error |", "|---|---|---|"]
        for r in rows:
            lines.append(f"| `{r['op']}` | {note(r['op'])} | {_cell(r.get('detail', ''))} |")
    passed = sorted(r["op"] for r in results.values() if r["class"] == "pass")
    lines += ["", f"## pass ({len(passed)})", "", ", ".join(f"`{p}`" for p in passed), ""]
    if half:
        counts = Counter(r["class"] for r in half.values())
        lines += ["## bfloat16", "",
                  f"The float32 passes that support bfloat16 ({len(half)} ops), their first sample in bfloat16 "
                  f"(`--dtype bfloat16 --only-passed --samples 1`), compared with eager bfloat16 (atol = rtol = "
                  f"{TOL['bfloat16']:g}): " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES) + ".", ""]
        rows = sorted((r for r in half.values() if r["class"] != "pass"), key=lambda r: r["op"])
        if rows:
            lines += ["| op | class | why | error |", "|---|---|---|---|"]
            lines += [f"| `{r['op']}` | {r['class']} | {note(r['op'])} | {_cell(r.get('detail', ''))} |"
                      for r in rows]
            lines.append("")
    DOC.write_text("\n".join(lines))


def _cell(text: str) -> str:
    text = re.sub(r"/\S*/site-packages/", "", re.sub(r"\s+", " ", text)).replace("|", "\\|")
    return text[:300]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="op names (an op's variants too); none: every op")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOL))
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/neuron-args-opinfo"))
    parser.add_argument("--rerun-failures", action="store_true")
    parser.add_argument("--only-passed", action="store_true", help="only the ops the float32 run passed")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--doc-only", action="store_true", help="write the doc from the cached results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.dtype, args.samples)
        return 0
    import torch

    warnings.filterwarnings("ignore")
    every = sorted(_ops(getattr(torch, args.dtype)))
    store = args.cache / f"{args.dtype}.json"
    known: dict[str, Any] = json.loads(store.read_text()) if store.exists() else {}
    if args.doc_only:
        names = []
    elif args.ops:
        names = [n for n in every if n in args.ops or n.split(".")[0] in args.ops or n.rsplit(".", 1)[0] in args.ops]
    elif args.rerun_failures:
        names = [n for n in every if known.get(n, {}).get("class") != "pass"]
    else:
        names = every
    if args.only_passed:
        passed = json.loads((args.cache / "float32.json").read_text())
        names = [n for n in names if passed.get(n, {}).get("class") == "pass"]
    t0 = time.time()
    results = sweep(names, args.dtype, args.samples, args.jobs, args.timeout)
    known.update(results)
    args.cache.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(known, indent=1, sort_keys=True))
    counts = Counter(r["class"] for r in results.values())
    print(f"{len(results)} ops in {time.time() - t0:.0f}s: " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES))
    if (args.doc_only or not args.ops and not args.no_doc) and args.dtype == "float32":
        half = args.cache / "bfloat16.json"
        write_doc({n: known[n] for n in every if n in known}, args.dtype, args.samples,
                  json.loads(half.read_text()) if half.exists() else None)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
