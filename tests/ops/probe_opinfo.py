"""Sweep torch's OpInfo database through the lowering: every op that supports float32 on CPU, its first samples
compiled (``fullgraph=True``, ``dynamic=False``, aot_autograd's forward lowered and run on XLA:CPU in-process, as
``tests/test_lowering_ops.py`` does) and compared with eager (atol = rtol = 1e-4 fp32, 2e-2 bf16; NaNs equal).

    .venv/bin/python -m tests.ops.probe_opinfo                   # the whole sweep; writes docs/OP_COVERAGE.md
    .venv/bin/python -m tests.ops.probe_opinfo cumsum gather     # some ops (their variants too), printed only
    .venv/bin/python -m tests.ops.probe_opinfo --rerun-failures  # the ops the last run did not pass, then the doc
    .venv/bin/python -m tests.ops.probe_opinfo --dtype bfloat16 --only-passed   # bf16, over the fp32 passes
    .venv/bin/python -m tests.ops.probe_opinfo --doc-only         # the doc from the cached results
    .venv/bin/python -m tests.ops.probe_opinfo --sequential       # first samples, one op after another per process

Needs ``expecttest`` (torch's test helpers import it): ``.venv/bin/pip install expecttest``. Each op runs in one of
two worker processes (``--jobs``), with a timeout: a hang or a crash costs that op, not the sweep. Results are kept
per op in ``/tmp/neuron-args-opinfo/<dtype>.json`` (``--cache``), so a rerun only redoes what it is asked to.

One class per op (its worst sample):

- ``pass``: every sample equal to eager (random ops and uninitialized memory: shapes and dtypes only);
- ``float64-pass``: a sample differs from eager, but equals eager computed in float64 where eager's float32 result
  does not (eager's own rounding);
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
import shutil
import subprocess
import tempfile
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: the sequential workers' compile caches (one per process, so an op rerun alone starts from an empty one)
COMPILE_CACHES = Path(tempfile.gettempdir()) / f"opinfo-compile-caches-{os.getpid()}"
DOC = ROOT / "docs" / "OP_COVERAGE.md"
CLASSES = ("pass", "float64-pass", "not-ours", "refused", "lowering-error", "wrong", "crash")
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
    r"^matrix_exp$": "a batch matrix of 1-norm ~27 scaled and squared 4 times: eager's float32 result is 3.5e-4 "
                     "off float64's at an element of 0.148 (tolerance 1.1e-4); the compiled one is 7e-5 off",
    r"^(nonzero|argwhere|masked_select|unique|unique_consecutive|combinations)$": "the output size depends on tensor "
                                                                                   "values: refused with the fix",
    r"^(narrow|tensor_split|item)$": "a Python number read from a tensor (.item()): refused, naming the read and the "
                                     "fix (the samples with Python ints pass)",
    r"^repeat_interleave$": "repeats given as a tensor without output_size: the size depends on the values (refused "
                            "with the fix); with output_size it lowers",
    r"^nn\.functional\.rrelu$": "training mode draws a random slope per element: refused with the fix (eval mode "
                                 "lowers)",
    r"^nn\.functional\.linear_cross_entropy\.chunked": "one sample (a 3-d linear_weight): Dynamo refuses a "
                                                        "function F.linear_cross_entropy calls; the others pass",
    r"^linalg\.vector_norm$": "ord=0 of a 0-d tensor: torchax reads the value into Python (other orders and shapes "
                              "pass)",
    r"^jiterator_": "CUDA-only",
    r"^(allclose|equal|cov|corrcoef)$": "Dynamo refuses a data-dependent Python value",
    r"^sparse\.|^to_sparse": "sparse tensors: Dynamo refuses them",
    r"^resize_": "Dynamo refuses resize_",
    r"^(linalg\.lstsq|nn\.functional\.ctc_loss)": "Dynamo refuses a dynamic-shape operator",
    # bfloat16 only (the float32 samples pass)
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


class SequentialCompile:
    """The ops of one worker compiled as a user's suite does: ``torch.compile(fullgraph=True)`` through the
    ``neuron_libtorch`` backend (the local compiler, one compile cache for the process), one op after another,
    Dynamo never reset. Each op gets a code object of its own, as each of a suite's tests has."""

    def __init__(self, root: Path) -> None:
        import tempfile

        import neuron_args  # noqa: F401 - registers the backends

        root.mkdir(parents=True, exist_ok=True)  # the parent removes it after the sweep (workers are killed)
        self.options = {"cache_dir": tempfile.mkdtemp(dir=root), "compiler": "local",
                        "target": "trn2", "compiler_args": ["--auto-cast=none"]}

    def compile(self, fn: Any, name: str, probe: Probe, fullgraph: bool) -> Any:
        import types

        import torch
        from torch._dynamo import lookup_backend

        real = lookup_backend("neuron_libtorch")

        def backend(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
            probe.graphs += 1
            probe.ops += sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            probe.phase = "backend"
            try:
                return real(gm, example_inputs, **kwargs)
            finally:
                probe.phase = "dynamo"

        code = fn.__code__.replace(co_name=re.sub(r"\W", "_", name))
        own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
        return torch.compile(own, backend=backend, options=self.options, fullgraph=fullgraph, dynamic=False)


def _clone(value: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


def _tensor_leaves(sample: Any) -> tuple[list[Any], Any, list[int]]:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
    return leaves, spec, [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]


def run_sample(op: Any, sample: Any, tol: float, fullgraph: bool, values: bool,
               sequential: SequentialCompile | None = None) -> tuple[str, str, list[str]]:
    """One sample: (class, detail, aten ops of the graphs). Isolated (Dynamo reset, the probe's own aot_autograd
    compiler) unless ``sequential`` compiles it through ``neuron_libtorch`` after the ops before it."""
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
        if sequential is None:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=_aot(probe), fullgraph=fullgraph, dynamic=False)
        else:
            compiled = sequential.compile(fn, full_name(op), probe, fullgraph)
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
        if values and _equals_float64_eager(fn, sample, [leaves[i] for i in positions], got, tol):
            return "float64-pass", _first(e, 3), probe.ops
        return "wrong", _first(e, 3), probe.ops
    if probe.graphs == 0:
        return "not-ours", "Dynamo made no graph (ran eagerly)", probe.ops
    return "pass", "", probe.ops


def _equals_float64_eager(fn: Any, sample: Any, tensors: list[Any], got: Any, tol: float) -> bool:
    """Whether ``got``, which differs from eager's float32 result, equals (at ``tol``) eager's result computed in
    float64 from the same inputs, while eager's float32 result does not: the difference is eager's own rounding
    (torch's test_ops arbitrates its references against a float64 run the same way). Only float32 results are
    arbitrated (dtypes are compared exactly first)."""
    import torch
    from torch.utils._pytree import tree_flatten

    got_leaves = [t for t in tree_flatten(got)[0] if isinstance(t, torch.Tensor)]
    if not got_leaves or any(t.dtype != torch.float32 for t in got_leaves):
        return False
    wide = [t.double() if t.dtype == torch.float32 else t for t in _clone(tensors)]
    try:
        precise = sample.output_process_fn_grad(fn(*wide))
        want = sample.output_process_fn_grad(fn(*_clone(tensors)))
    except Exception:  # noqa: BLE001 - no float64 kernel: no arbitration
        return False

    def close(a: Any, b: Any) -> bool:
        try:
            torch.testing.assert_close(a, b, atol=tol, rtol=tol, equal_nan=True, check_stride=False,
                                       check_dtype=False)
        except AssertionError:
            return False
        return True

    return close(got, precise) and not close(want, precise)


def _drops_out(sample: Any) -> bool:
    """The sample applies dropout (sdpa's ``dropout_p``, multi-head attention in training): random numbers."""
    kw = sample.kwargs
    return kw.get("dropout_p", 0) > 0 or (kw.get("training") is True and any(
        isinstance(a, float) and 0 < a < 1 for a in sample.args))


def _aot(probe: Probe) -> Any:
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=probe.fw_compiler)


def _failure(probe: Probe, e: BaseException) -> str:
    from neuron_args.errors import LoweringError, NeuronArgsError

    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    if any(isinstance(c, LoweringError) for c in chain) or probe.phase == "lower":
        return "refused" if any(REFUSAL.search(str(c)) for c in chain) else "lowering-error"
    if probe.phase in ("xla-compile", "run", "backend") or any(isinstance(c, NeuronArgsError) for c in chain):
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


def probe_op(op: Any, dtype: Any, samples: int, sequential: SequentialCompile | None = None) -> dict[str, Any]:
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
            kind, detail, ops = run_sample(op, sample, tol, True, values, sequential)
            if kind == "not-ours":  # Dynamo refused one graph: lower the pieces it can make
                kind2, detail2, ops2 = run_sample(op, sample, tol, False, values, sequential)
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
    return {"pass": 0, "float64-pass": 1, "not-ours": 2, "refused": 3, "wrong": 4, "lowering-error": 5,
            "crash": 6}[kind]


def worker(dtype_name: str, samples: int, sequential: Path | None = None) -> None:
    """Read op names from stdin; print one JSON result line per op (``sequential``: see
    :class:`SequentialCompile`)."""
    import torch

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    torch._dynamo.config.suppress_errors = False
    dtype = getattr(torch, dtype_name)
    ops = _ops(dtype)
    compiler = SequentialCompile(sequential) if sequential else None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        t0 = time.time()
        try:
            result = probe_op(ops[name], dtype, samples, compiler)
        except BaseException as e:  # noqa: BLE001
            result = {"op": name, "class": "crash", "detail": f"probe raised {_first(e)}", "aten": [],
                      "trace": traceback.format_exc()[-600:]}
        result["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(result), flush=True)


# -- the parent: workers with timeouts, the result cache, the doc


class Worker:
    def __init__(self, dtype: str, samples: int, sequential: bool = False) -> None:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHDYNAMO_VERBOSE": "0"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.ops.probe_opinfo", "--worker", "--dtype", dtype,
                                      "--samples", str(samples)] + ["--sequential"] * sequential
                                     + ["--compile-caches", str(COMPILE_CACHES)],
                                     cwd=ROOT, stdin=subprocess.PIPE,
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


def sweep(names: list[str], dtype: str, samples: int, jobs: int, timeout: float, sequential: bool = False,
          fresh: bool = False) -> dict[str, dict[str, Any]]:
    """Probe ``names`` on ``jobs`` workers; a worker that dies or passes ``timeout`` on one op is replaced.
    ``sequential``: each worker compiles its ops one after another (:class:`SequentialCompile`), its slice of the
    ops in order; ``fresh``: a new worker for every op (each op compiled alone in its process)."""
    todo, results = list(names), {}
    workers = [Worker(dtype, samples, sequential) for _ in range(min(jobs, len(todo)))]

    def replace(w: Worker, failure: str | None) -> None:
        """Stop ``w`` (its op, if any, crashed with ``failure``); start another while ops remain."""
        if w.op is not None and failure is not None:
            results[w.op] = {"op": w.op, "class": "crash", "detail": failure, "aten": []}
            _report(results[w.op], len(results), len(names))
        w.stop()
        workers.remove(w)
        if todo:
            workers.append(Worker(dtype, samples, sequential))

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
                if fresh:
                    w.op = None
                    replace(w, None)
                    continue
            if todo:
                w.send(todo.pop(0))
            else:
                w.stop()
                workers.remove(w)
    return results


def _report(r: dict[str, Any], done: int, total: int) -> None:
    print(f"[{done}/{total}] {r['op']}: {r['class']} {r.get('detail', '')[:200]}", flush=True)


def write_doc(results: dict[str, dict[str, Any]], dtype: str, meta: dict[str, Any] | None,
              half: dict[str, dict[str, Any]] | None = None, seq: dict[str, dict[str, Any]] | None = None,
              seq_meta: dict[str, Any] | None = None) -> None:
    import jax
    import torch

    from neuron_args.lowering.torchax_compat import import_torchax

    torchax = import_torchax()
    counts = Counter(r["class"] for r in results.values())
    total = len(results)
    meta = meta or {}
    samples = meta.get("samples", 3)
    lines = [
        "# Op coverage",
        "",
        f"Generated by `tests/ops/probe_opinfo.py` — do not edit by hand. Regenerate with "
        f"`.venv/bin/python -m tests.ops.probe_opinfo --jobs 1` then `--sequential --jobs 1` (needs "
        f"`pip install expecttest`; `--rerun-failures` redoes only the ops that did not pass). Full sweep of "
        f"{meta.get('date', '?')} with torch {torch.__version__}, torchax {torchax.__version__}, jax "
        f"{jax.__version__}: {_duration(meta)}.",
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
        "float64-pass": "a sample differs from eager beyond the tolerance, but equals eager run in float64 (same "
                        "tolerance) where eager's float32 result does not: eager's own rounding (torch's test_ops "
                        "arbitrates its references against a float64 run the same way)",
        "not-ours": "Dynamo or aot_autograd refused it before the lowering saw a graph (data-dependent output "
                    "sizes, ops Dynamo does not trace); with graph breaks, what it made passed",
        "refused": "our lowering refused it, naming the op and the fix: a limit of static graphs (an output size "
                   "that depends on tensor values) or of Neuron devices (64-bit arithmetic)",
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
    if seq:
        lines += _sequential_section({n: seq[n] for n in results if n in seq}, seq_meta or {})
    if not half:
        lines += ["## bfloat16", "", "Not swept with this run (`--dtype bfloat16 --only-passed --samples 1` adds it).",
                  ""]
    else:
        counts = Counter(r["class"] for r in half.values())
        lines += ["## bfloat16", "",
                  f"The float32 passes that support bfloat16 ({len(half)} ops), their first sample in bfloat16 "
                  f"(`--dtype bfloat16 --only-passed --samples 1`), compared with eager bfloat16 (atol = rtol = "
                  f"{TOL['bfloat16']:g}): " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES) + ".", ""]
        lines += _failures(half, "class", lambda r: note(r["op"]))
    DOC.write_text("\n".join(lines))


def _failures(results: dict[str, dict[str, Any]], middle: str, last: Any) -> list[str]:
    """A table of the ops that did not pass: op, class, ``middle`` (a column name), error."""
    rows = sorted((r for r in results.values() if r["class"] != "pass"), key=lambda r: r["op"])
    if not rows:
        return []
    return ["| op | class | " + ("why" if middle == "class" else middle) + " | error |", "|---|---|---|---|",
            *(f"| `{r['op']}` | {r['class']} | {last(r)} | {_cell(r.get('detail', ''))} |" for r in rows), ""]


def _duration(meta: dict[str, Any]) -> str:
    if "seconds" not in meta:
        return "run time not recorded"
    return f"{meta['seconds'] / 60:.0f} min on {meta['jobs']} worker process(es) of a shared 2-core machine"


def _sequential_section(seq: dict[str, dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The one-process run (``--sequential``): its counts, and every op whose result depends on what the process
    compiled before it (its class alone in a fresh process differs)."""
    counts = Counter(r["class"] for r in seq.values())
    dependent = sorted((r for r in seq.values() if r.get("alone", r["class"]) != r["class"]), key=lambda r: r["op"])
    lines = ["## One process, one op after another", "",
             f"As a user's suite runs them (`--sequential`): each op's first sample compiled with "
             f"`torch.compile(fullgraph=True, dynamic=False)` through the `neuron_libtorch` backend (local "
             f"compiler, one compile cache) after the ops before it in the same process, Dynamo never reset; "
             f"{meta.get('jobs', '?')} worker process(es), each a slice of the ops in order; {_duration(meta)}. "
             f"An op that did not pass was rerun alone in a fresh process: a different class there means its result "
             f"depends on what was compiled before.", "",
             f"{len(seq)} ops: " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES) +
             f"; order-dependent: {len(dependent)}.", ""]
    return lines + _failures(seq, "alone", lambda r: r.get("alone", "?"))


def _cell(text: str) -> str:
    text = re.sub(r"/\S*/site-packages/", "", re.sub(r"\s+", " ", text)).replace("|", "\\|")
    return text[:300]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="op names (an op's variants too); none: every op")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOL))
    parser.add_argument("--samples", type=int, default=None, help="samples per op (default 3; 1 with --sequential)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/neuron-args-opinfo"))
    parser.add_argument("--rerun-failures", action="store_true")
    parser.add_argument("--only-passed", action="store_true", help="only the ops the float32 run passed")
    parser.add_argument("--sequential", action="store_true",
                        help="as a user's suite: each worker compiles its slice of the ops one after another "
                             "through neuron_libtorch; an op that does not pass is rerun alone in a fresh process "
                             "to tell whether its result depends on what was compiled before")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--doc-only", action="store_true", help="write the doc from the cached results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-caches", type=Path, default=COMPILE_CACHES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    samples = args.samples or (1 if args.sequential else 3)
    if args.worker:
        worker(args.dtype, samples, args.compile_caches if args.sequential else None)
        return 0
    import torch

    warnings.filterwarnings("ignore")
    every = sorted(_ops(getattr(torch, args.dtype)))
    mode = "-sequential" if args.sequential else ""
    store, meta = args.cache / f"{args.dtype}{mode}.json", args.cache / f"{args.dtype}{mode}.meta.json"
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
    try:
        results = sweep(names, args.dtype, samples, args.jobs, args.timeout, args.sequential)
        if args.sequential:  # what did not pass, alone in a fresh process: a different class depends on the order
            alone = sweep([n for n, r in results.items() if r["class"] != "pass"], args.dtype, samples, 1,
                          args.timeout, True, fresh=True)
            for n, r in alone.items():
                results[n]["alone"] = r["class"]
    finally:
        shutil.rmtree(COMPILE_CACHES, ignore_errors=True)
    seconds = time.time() - t0
    known.update(results)
    args.cache.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(known, indent=1, sort_keys=True))
    if names == every:
        meta.write_text(json.dumps({"seconds": round(seconds), "jobs": args.jobs, "samples": samples,
                                    "date": time.strftime("%Y-%m-%d")}))
    counts = Counter(r["class"] for r in results.values())
    print(f"{len(results)} ops in {seconds:.0f}s: " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES))
    if (args.doc_only or not args.ops and not args.no_doc) and args.dtype == "float32":
        def cached(name: str) -> Any:
            path = args.cache / name
            return json.loads(path.read_text()) if path.exists() else None

        fp32 = cached("float32.json") or {}
        write_doc({n: fp32[n] for n in every if n in fp32}, "float32", cached("float32.meta.json"),
                  cached("bfloat16.json"), cached("float32-sequential.json"), cached("float32-sequential.meta.json"))
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
