"""The serve path: a served decode step against eager PyTorch, a whole compiled call against its loaded
executable, and the runtime's execution choices (sync vs async XLA:CPU client, DLPack vs numpy).

    python benchmarks/bench_serve.py [--quick]

Three runner models, compiled once by the local compiler into a temp cache, all with one torch
thread (as ``examples/tiny_vlm/main.py`` serves; spinning OpenMP threads on a busy 2-core machine
make eager runs 5-20x slower and noisy):

- the decoder block of ``tests/models.py`` (batch 2) with a ``prefill`` (T=5) and a ``decode``
  (T=1) graph type; the decode step writes its KV buffers in place (copy-back each call);
- the MLP of ``tests/models.py`` (batch 4), one graph type;
- with ``transformers`` installed, the example Llama of ``examples/hf_llama`` (2 layers, batch 1,
  a static KV cache of 64 positions written in place), its ``decode`` graph type.

Per call, all interleaved repetition by repetition (median and min of the repetitions):

- ``eager``: the same module (a deep copy: same weights) in eager PyTorch, under inference mode;
- ``served``: ``runner.run(graph_type, kwargs)`` inside ``runner.serve()``: the fast path;
- ``guarded``: the same with the fast path off (Dynamo frame evaluation + guards + aot runtime
  wrapper + variant dispatch), and that under ``torch.compiler.set_stance(skip_guard_eval_unsafe=
  True)`` and ``set_stance("fail_on_recompile")`` (the stances compared with the fast path);
- ``compiled call``: the runner's ``torch.compile``'d entry called directly in its scope (Dynamo,
  then the seam's direct call: the graph and the copy-back of mutated inputs);
- ``compiled call, aot wrapper``: the same on a copy of the entry compiled with
  ``NEURON_ARGS_DIRECT_CALL=0`` (aot_autograd's runtime wrapper, as before the direct call); and on
  copies compiled with ``guard_filter_fn=`` ``skip_guard_on_all_nn_modules_unsafe`` / ``keep_tensor_guards_unsafe``;
- ``Dynamo alone``: a copy compiled by a backend that returns outputs computed once (the floor of
  any ``torch.compile``'d call: frame evaluation, guards, Dynamo's ``disable`` wrapper);
- ``seam's call``: what the seam returned to Dynamo for a copy, called on the flat arguments: the
  direct call, and aot_autograd's runtime wrapper;
- ``variant``: the graph's ``CompiledGraph`` variant on its flat arguments (what the fast path calls);
- ``executable``: the ``LoadedExecutable`` on the flat arguments (DLPack in/out, synchronous client);
- where a served call goes: each step of the fast path's call timed alone on the real objects (guard
  manager, Dynamo's code with the variant swapped in, variant, the executable's input buffers, execute, outputs);
- ``legacy executable``: the runtime before this change, inline (numpy conversions, jax's
  asynchronous client, one copy per output);
- ``execute sync`` / ``execute async``: ``execute_sharded`` alone on device buffers prepared once,
  on the synchronous client and on jax's asynchronous one.

Figures (``benchmarks/figures.py``): served decode step / eager (target <= 0.50; the Llama's <= 0.75);
whole compiled call / loaded executable for the MLP and the decode step (target <= 1.10), and the same
for the served call. Prints a table; asserts nothing on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from figures import figure, load, per_call_us  # noqa: E402
from neuron_args import executables, fastpath, xla_cpu  # noqa: E402
from neuron_args.graphs import GraphSpec  # noqa: E402
from neuron_args.runner import NeuronRunner  # noqa: E402
from neuron_args.runtime import LoadedExecutable  # noqa: E402
from neuron_args.tensors import TensorSpec, numpy_dtype, tensor_to_numpy  # noqa: E402
from neuron_args.seams import backends, dispatch  # noqa: E402
from tests.models import decoder_inputs, make_decoder, make_mlp, mlp_inputs  # noqa: E402
from tests.xla_run import placer  # noqa: E402

BASE = ["--auto-cast=none", "-O1"]




class DecoderModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = make_decoder()

    def neuron_graphs(self) -> list[GraphSpec]:
        def kw(seq: int, start: int) -> Callable[[], dict[str, torch.Tensor]]:
            return lambda: dict(zip(("tokens", "input_pos"), decoder_inputs(seq=seq, start=start)))

        return [GraphSpec("prefill", self.block, {"t5": kw(5, 0)}), GraphSpec("decode", self.block, {"t1": kw(1, 5)})]


class MLPModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = make_mlp()

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("mlp", self.mlp, {"b4": lambda: {"x": mlp_inputs(batch=4)[0]}})]


class LegacyExecutable:
    """The runtime before this change: numpy in (``batched_device_put``), jax's async client, a copy out."""

    def __init__(self, blob: bytes, input_specs: tuple[TensorSpec, ...], output_specs: tuple[TensorSpec, ...]) -> None:
        self.executable = xla_cpu.deserialize_executable(blob, xla_cpu.cpu_client())
        self.put = placer(self.executable.local_devices()[0])
        self.casts = [numpy_dtype(s.lowered_dtype) if s.lowered_dtype != s.dtype else None for s in input_specs]
        self.back = [numpy_dtype(s.dtype) if s.lowered_dtype != s.dtype else None for s in output_specs]

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        arrays = [tensor_to_numpy(a) if c is None else tensor_to_numpy(a).astype(c) for a, c in zip(args, self.casts)]
        result = self.executable.execute_sharded([self.put(a) for a in arrays])
        outs = [np.asarray(o[0]) for o in result.disassemble_into_single_device_arrays()]
        return [torch.from_numpy(o.copy() if b is None else o.astype(b)) for o, b in zip(outs, self.back)]


def measure(title: str, runner: NeuronRunner, graph_type: str, kwargs: dict[str, Any], eager_module: torch.nn.Module,
            calls: int, reps: int) -> dict[str, float]:
    fast = runner.fast_path.graphs[graph_type][0]
    compiled = runner.compiled(graph_type)
    with runner.scope(graph_type), torch.inference_mode():
        args = observed_args(lambda: compiled(**kwargs))
    specs = [TensorSpec.of(a) for a in args]
    key, exe = next((k, e) for k, e in executables._loaded.items() if list(e.input_specs) == specs)
    blob = runner.cache.entry(key).executable_path.read_bytes()
    legacy = LegacyExecutable(blob, exe.input_specs, exe.output_specs)
    async_exe = LoadedExecutable.from_bytes(blob, exe.input_specs, exe.output_specs,
                                            client=xla_cpu.cpu_client())
    aot_compiled, aot_call, aot_args = seam_copy(runner, graph_type, kwargs, direct=False)
    _, direct_call, direct_args = seam_copy(runner, graph_type, kwargs, direct=True)
    no_module_guards = seam_copy(runner, graph_type, kwargs, direct=True,
                                 guard_filter=torch.compiler.skip_guard_on_all_nn_modules_unsafe)[0]
    tensor_guards_only = seam_copy(runner, graph_type, kwargs, direct=True,
                                   guard_filter=torch.compiler.keep_tensor_guards_unsafe)[0]
    dynamo_only = dynamo_floor(runner, graph_type, kwargs)
    positional = tuple(kwargs.values())
    sync_bufs = [f(a) for f, a in zip(exe._convert_in, args)]
    async_bufs = [f(a) for f, a in zip(async_exe._convert_in, args)]

    def execute_async() -> Any:
        outs = async_exe.executable.execute_sharded(async_bufs).disassemble_into_single_device_arrays()
        for o in outs:
            o[0].block_until_ready()
        return outs

    def guarded() -> Any:
        return runner.run(graph_type, kwargs)

    @contextlib.contextmanager
    def fast_path_off() -> Any:
        saved, runner.fast_path.graphs = runner.fast_path.graphs, {}
        runner.fast_path.enabled = False
        try:
            yield
        finally:
            runner.fast_path.graphs, runner.fast_path.enabled = saved, True

    @contextlib.contextmanager
    def skip_guards() -> Any:
        with fast_path_off(), torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            yield

    @contextlib.contextmanager
    def fail_on_recompile() -> Any:
        with fast_path_off(), torch.compiler.set_stance("fail_on_recompile"):
            yield

    fns: dict[str, Callable[[], Any]] = {
        "eager": lambda: eager_module(*positional),
        "served": lambda: runner.run(graph_type, kwargs),
        "guarded": guarded,
        "guarded_skip_guards": guarded,
        "guarded_fail_on_recompile": guarded,
        "compiled_call": lambda: compiled(**kwargs),
        "compiled_call_aot": lambda: aot_compiled(**kwargs),
        "compiled_no_module_guards": lambda: no_module_guards(**kwargs),
        "compiled_tensor_guards": lambda: tensor_guards_only(**kwargs),
        "dynamo_floor": lambda: dynamo_only(**kwargs),
        "seam_direct": lambda: direct_call(*direct_args),
        "seam_aot": lambda: aot_call(*aot_args),
        "variant": lambda: fast.run(args),
        "executable": lambda: exe(*args),
        "legacy_executable": lambda: legacy(*args),
        "execute_sync": lambda: exe.executable.execute_sharded(sync_bufs).disassemble_into_single_device_arrays(),
        "execute_async": execute_async,
    }
    around = {"guarded": fast_path_off, "guarded_skip_guards": skip_guards,
              "guarded_fail_on_recompile": fail_on_recompile, "compiled_call": lambda: runner.scope(graph_type),
              "compiled_no_module_guards": lambda: runner.scope(graph_type),
              "compiled_tensor_guards": lambda: runner.scope(graph_type),
              "compiled_call_aot": lambda: runner.scope(graph_type), "seam_direct": lambda: runner.scope(graph_type),
              "seam_aot": lambda: runner.scope(graph_type)}
    with torch.inference_mode(), runner.serve():
        same = torch.equal(runner.run(graph_type, kwargs), exe(*args)[-1]) and \
            torch.allclose(legacy(*args)[-1], exe(*args)[-1])
        for name, fn in fns.items():
            with around.get(name, contextlib.nullcontext)():
                for _ in range(30):
                    fn()
        fast_before = fast.calls
        times = per_call_us(fns, calls, reps, around)
        assert fast.calls - fast_before == calls * reps, "the served calls took the fast path"
        parts_times = breakdown(fast, exe, kwargs, args, calls, reps)
    m = {k: statistics.median(v) for k, v in times.items()}
    lo = {k: min(v) for k, v in times.items()}
    print(f"{title} ({reps} reps x {calls} calls, interleaved; served == executable: {same})")
    print(f"  {'per call':<64} {'median':>8} {'min':>8}")
    labels = {
        "eager": "eager PyTorch (same module, inference mode)",
        "served": "served: runner.run() in serve(), fast path",
        "guarded": "served, fast path off (Dynamo + guards + aot wrapper)",
        "guarded_skip_guards": "  the same under set_stance(skip_guard_eval_unsafe=True)",
        "guarded_fail_on_recompile": "  the same under set_stance('fail_on_recompile')",
        "compiled_call": "whole torch.compile'd call, in the graph type's scope",
        "compiled_call_aot": "  the same through aot_autograd's wrapper (NEURON_ARGS_DIRECT_CALL=0)",
        "compiled_no_module_guards": "  the same, guard_filter_fn=skip_guard_on_all_nn_modules_unsafe",
        "compiled_tensor_guards": "  the same, guard_filter_fn=keep_tensor_guards_unsafe",
        "dynamo_floor": "  Dynamo alone: a backend returning the graph's outputs as computed once",
        "seam_direct": "what the seam returns to Dynamo, on the flat arguments: direct call",
        "seam_aot": "  the same: aot_autograd's runtime wrapper (NEURON_ARGS_DIRECT_CALL=0)",
        "variant": "CompiledGraph variant on the flat arguments",
        "executable": "LoadedExecutable (sync client, DLPack, aliased inputs)",
        "legacy_executable": "legacy executable (async client, numpy, copy out)",
        "execute_sync": "execute_sharded alone, synchronous client",
        "execute_async": "execute_sharded alone, jax's asynchronous client",
    }
    for name, label in labels.items():
        print(f"  {label:<64} {m[name]:>8.1f} {lo[name]:>8.1f} us")
    # each ratio as (numerator, denominator), taken of the medians and of the minimums
    parts = {
        "served / eager": ("served", "eager"),
        "whole compiled call / loaded executable": ("compiled_call", "executable"),
        "compiled call, aot wrapper / loaded executable": ("compiled_call_aot", "executable"),
        "Dynamo alone / loaded executable": ("dynamo_floor", "executable"),
        "seam's call, direct / aot wrapper": ("seam_direct", "seam_aot"),
        "served / loaded executable": ("served", "executable"),
        "guarded / served": ("guarded", "served"),
        "guarded / guarded with skip_guard_eval_unsafe": ("guarded", "guarded_skip_guards"),
        "guarded / guarded with fail_on_recompile": ("guarded", "guarded_fail_on_recompile"),
        "compiled call / with nn-module guards filtered out": ("compiled_call", "compiled_no_module_guards"),
        "compiled call / with tensor guards only": ("compiled_call", "compiled_tensor_guards"),
        "legacy executable / executable": ("legacy_executable", "executable"),
        "execute async / sync": ("execute_async", "execute_sync"),
    }
    ratios = {name: m[a] / m[b] for name, (a, b) in parts.items()}
    on_mins = {name: lo[a] / lo[b] for name, (a, b) in parts.items()}
    print(f"  {'where a served call goes: each part alone (steps of the one below are its parts)':<64} "
          f"{'median':>8} {'min':>8}")
    for name, (med, low) in parts_times.items():
        print(f"  {name:<64} {med:>8.1f} {low:>8.1f} us")
    print(f"  {'ratio (of medians; of mins)':<64} {'median':>8} {'min':>8}")
    for name, value in ratios.items():
        print(f"  {name:<64} {value:>8.2f} {on_mins[name]:>8.2f}")
    print()
    return {**ratios, **{f"min: {k}": v for k, v in on_mins.items()}}


def breakdown(fast: Any, exe: LoadedExecutable, kwargs: dict[str, Any], args: list[Any], calls: int, reps: int
              ) -> dict[str, tuple[float, float]]:
    """Each step of a served call timed alone on the real objects (median, min us), interleaved. Alone each
    step runs warm in the CPU's caches, so the steps sum to less than the served call (``served``)."""
    frame = fastpath._frame(fast.defaults, kwargs, fast.frame_self, fast.star)
    bufs = [f(a) for f, a in zip(exe._convert_in, args)]
    handlers = exe._handlers  # jaxlib's result handlers, built by the executable's first call
    results = exe.executable.execute_sharded(bufs).consume_with_handlers(handlers)
    fns: dict[str, Callable[[], Any]] = {
        "FastGraph call (the served call without runner.run, serving_kwargs)": lambda: fast(kwargs),
        "  Dynamo's guard manager on the frame's locals": lambda: fast.guard_manager.check(frame),
        "  Dynamo's code for the frame, calling the variant directly": lambda: fast.code(fast.frame_self, **kwargs),
        "    the variant (CompiledGraph's call on the flat arguments)": lambda: fast.run(args),
        "      LoadedExecutable": lambda: exe(*args),
        "        input buffers (bulk check of weights/caches, casts)": lambda: exe.input_buffers(args),
        "        execute_sharded + result handlers": lambda: exe.executable.execute_sharded(bufs)
        .consume_with_handlers(handlers),
        "        outputs to torch (DLPack)": lambda: [f(o) for f, o in zip(exe._convert_out, results)],
    }
    times = per_call_us(fns, calls, reps)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def hf_decode(cache_dir: Path, calls: int, reps: int) -> dict[str, float] | None:
    """The example transformers Llama (``examples/hf_llama``: 2 layers, static KV cache) decode step, or None
    without transformers: its graphs reach the fast path through the cache's attribute chains and the
    replayed output-capturing reset."""
    try:
        from examples.hf_llama.model import HFLlama
    except ImportError:
        print("3. transformers Llama: skipped (pip install -e '.[hf]')\n")
        return None
    model = HFLlama(seed=0, max_cache_len=64, prefill_buckets=(16,))
    runner = NeuronRunner(model, compiler_args=BASE, compiler="local", cache_dir=cache_dir)
    t0 = time.perf_counter()
    runner.warmup(emit=False)
    print(f"warmup (2 graphs of the transformers Llama): {time.perf_counter() - t0:.1f} s; fast path refused: "
          f"{runner.fast_path.refused or 'none'}\n")
    with torch.inference_mode():
        kwargs = {"input_ids": torch.tensor([[5]]), "start": torch.tensor(16)}
    return measure("3. decode step, transformers Llama (examples/hf_llama, static KV cache written in place)", runner,
                   "decode", kwargs, copy.deepcopy(model), calls, reps)


def dynamo_floor(runner: NeuronRunner, graph_type: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """A copy of the entry compiled by a backend whose call costs nothing: what Dynamo alone costs per call."""
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        outs: list[Any] = []

        def cached(*args: Any) -> Any:
            if not outs:
                outs.extend(gm(*args))
            return outs

        return cached

    fn = torch.compile(copy.deepcopy(runner.spec(graph_type).entry), backend=backend, dynamic=False)
    with torch.inference_mode():
        fn(**kwargs)
    return fn


def observed_args(call: Callable[[], Any]) -> list[Any]:
    """The flat arguments of the one compiled graph ``call()`` runs (as the fast path's recording sees them)."""
    seen: list[fastpath.Observed] = []
    fastpath._observed_call(call, seen)
    assert len(seen) == 1, f"{len(seen)} graphs ran"
    return seen[0].args


def seam_copy(runner: NeuronRunner, graph_type: str, kwargs: dict[str, Any], direct: bool,
              guard_filter: Callable[..., Any] | None = None
              ) -> tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]:
    """A copy of the graph type's entry (its own KV cache) compiled with the seam's direct call or with
    aot_autograd's runtime wrapper (``NEURON_ARGS_DIRECT_CALL=0``): the compiled copy, what the seam
    returned to Dynamo (without Dynamo's ``disable`` wrapper) and the copy's flat graph arguments."""
    returned = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        returned.append(getattr(backends, runner.backend)(gm, example_inputs, options=runner.options))
        return returned[-1]

    # another backend object: Dynamo does not reuse the runner's cache entry for the copy
    entry = copy.deepcopy(runner.spec(graph_type).entry)
    fn = torch.compile(entry, backend=backend, dynamic=False,
                       options=None if guard_filter is None else {"guard_filter_fn": guard_filter})
    os.environ[dispatch.ENV] = "1" if direct else "0"
    try:
        with runner.scope(graph_type), torch.inference_mode():
            fn(**kwargs)  # Dynamo compiles here; the cache entry is built: no compile
            args = observed_args(lambda: fn(**kwargs))
    finally:
        del os.environ[dispatch.ENV]
    assert len(returned) == 1 and (getattr(returned[0], "plan", None) is not None) == direct
    call = getattr(returned[0], "_torchdynamo_orig_callable", returned[0])
    return fn, call, tuple(args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    ns = parser.parse_args()
    calls, reps = (20, 25) if ns.quick else (20, 150)  # many short repetitions: their min resists load
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 256  # the copies compiled outside runner calls share ServedForward's frame
    print(f"bench_serve: {load()} (start); torch {torch.__version__}, 1 torch thread")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        decoder = NeuronRunner(DecoderModel(), compiler_args=BASE, compiler="local", cache_dir=Path(tmp) / "dec")
        mlp = NeuronRunner(MLPModel(), compiler_args=BASE, compiler="local", cache_dir=Path(tmp) / "mlp")
        t0 = time.perf_counter()
        decoder.warmup(emit=False)
        mlp.warmup(emit=False)
        print(f"warmup (3 graphs, local compiler): {time.perf_counter() - t0:.1f} s\n")
        with torch.inference_mode():
            tokens, pos = decoder_inputs(seq=1, start=5)
            x = mlp_inputs(batch=4)[0]
        dec = measure("1. decode step, decoder block batch 2 (KV cache copied back)", decoder, "decode",
                      {"tokens": tokens, "input_pos": pos}, copy.deepcopy(decoder.model.block), calls, reps)
        print(f"   ({load()})\n")
        mlp_r = measure("2. MLP 4x32 -> 64 -> 16", mlp, "mlp", {"x": x}, copy.deepcopy(mlp.model.mlp), calls, reps)
        print(f"   ({load()})\n")
        hf = hf_decode(Path(tmp) / "hf", calls, reps)
    def of_mins(r: dict[str, float], name: str) -> str:
        return f"ratio of mins {r['min: ' + name]:.2f}"

    figure("served decode step / eager (decoder block, batch 2)", dec["served / eager"], "<= 0.50",
           note=of_mins(dec, "served / eager"))
    figure("whole torch.compile'd call / loaded executable, MLP", mlp_r["whole compiled call / loaded executable"],
           "<= 1.10", note=of_mins(mlp_r, "whole compiled call / loaded executable"))
    figure("whole torch.compile'd call / loaded executable, decode step",
           dec["whole compiled call / loaded executable"], "<= 1.10",
           note=of_mins(dec, "whole compiled call / loaded executable"))
    figure("whole torch.compile'd call through aot_autograd's wrapper / loaded executable, MLP",
           mlp_r["compiled call, aot wrapper / loaded executable"], None,
           note=of_mins(mlp_r, "compiled call, aot wrapper / loaded executable"))
    figure("whole torch.compile'd call through aot_autograd's wrapper / loaded executable, decode step",
           dec["compiled call, aot wrapper / loaded executable"], None,
           note=of_mins(dec, "compiled call, aot wrapper / loaded executable"))
    figure("torch.compile'd call with a no-op backend (Dynamo alone) / loaded executable, MLP",
           mlp_r["Dynamo alone / loaded executable"], None, note=of_mins(mlp_r, "Dynamo alone / loaded executable"))
    figure("torch.compile'd call with a no-op backend (Dynamo alone) / loaded executable, decode step",
           dec["Dynamo alone / loaded executable"], None, note=of_mins(dec, "Dynamo alone / loaded executable"))
    figure("seam's call on the flat arguments, direct / aot_autograd's wrapper, MLP",
           mlp_r["seam's call, direct / aot wrapper"], None, note=of_mins(mlp_r, "seam's call, direct / aot wrapper"))
    figure("seam's call on the flat arguments, direct / aot_autograd's wrapper, decode step",
           dec["seam's call, direct / aot wrapper"], None, note=of_mins(dec, "seam's call, direct / aot wrapper"))
    figure("served call (fast path) / loaded executable, MLP", mlp_r["served / loaded executable"], "<= 1.10",
           note=of_mins(mlp_r, "served / loaded executable"))
    figure("served call (fast path) / loaded executable, decode step", dec["served / loaded executable"], "<= 1.10",
           note=of_mins(dec, "served / loaded executable"))
    figure("guarded served call / fast path, decode step", dec["guarded / served"], None, "x")
    figure("guarded / guarded with skip_guard_eval_unsafe, decode step",
           dec["guarded / guarded with skip_guard_eval_unsafe"], None, "x")
    figure("execute_sharded async client / sync client, MLP", mlp_r["execute async / sync"], None, "x")
    figure("execute_sharded async client / sync client, decode step", dec["execute async / sync"], None, "x")
    figure("legacy executable / LoadedExecutable, MLP", mlp_r["legacy executable / executable"], None, "x")
    figure("legacy executable / LoadedExecutable, decode step", dec["legacy executable / executable"], None, "x")
    if hf is not None:
        figure("served decode step / eager (transformers Llama, examples/hf_llama)", hf["served / eager"], "<= 0.75",
               note=of_mins(hf, "served / eager"))
        figure("guarded served call / fast path, transformers Llama decode step", hf["guarded / served"], None, "x",
               note=of_mins(hf, "guarded / served"))
        figure("served call (fast path) / loaded executable, transformers Llama decode step",
               hf["served / loaded executable"], "<= 1.10", note=of_mins(hf, "served / loaded executable"))
    print(f"bench_serve: {load()} (end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
