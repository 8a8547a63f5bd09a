"""The compile path: per-call overhead on a cache hit, and lowering/compile/run time at -O1 vs -O3.

    python benchmarks/bench_compile.py [--quick] [--profile] [--skip-decoder]

1. Hit path, all under ``torch.inference_mode()``, for 1.1 the tests/models.py MLP (batch 4: the
   small graph the target is about) and 1.2 the decoder block's decode step (T=1, KV buffers
   mutated in place, so aot_autograd copies them back after each call):

   - ``cm(...)``: the model compiled with ``torch.compile(backend="neuron_libtorch", dynamic=False)``
     (compiler "local", cache in a temp dir), after warm-up;
   - ``cg(args)``: the :class:`CompiledGraph` the seam returned, called directly with the graph's
     flat argument list (lifted parameters and buffers + the inputs): variant dispatch + below;
   - ``exe(*args)``: the same executable as a :class:`LoadedExecutable` loaded from the cache entry
     (specs from ``metadata.json``): tensor<->numpy conversions + execute + output copies;
   - ``tests.xla_run.execute(executable, arrays)`` on numpy arrays: the runtime call alone;
   - the torch.compile floor: the same model through Dynamo + aot_autograd with a forward that
     returns preallocated outputs (what torch.compile costs when the graph costs nothing);
   - the eager model, for reference;
   - the runtime before its synchronous client, side by side: the executable deserialized on
     jax's asynchronous XLA:CPU client, called directly and as the variant of the compiled model.

   Target: ``cm / exe <= 1.10``. The breakdown is measured inside the compiled model's own calls
   (timing wrappers around ``CompiledGraph.__call__``, ``LoadedExecutable.__call__`` and the
   executable's ``execute_sharded``): Dynamo guards + aot runtime wrapper (everything outside the
   CompiledGraph), our variant dispatch, the LoadedExecutable conversions, the execute call.
   ``--profile`` adds a cProfile of the compiled model's call.

2. Decoder block (``make_decoder``, prefill T=5) at -O1 and -O3: ``lower_fx_graph`` time (the
   same for both levels: the level only reaches the compiler), the local compiler's wall time
   (on its warm worker: jax starts once, with the first compile; ``NEURON_ARGS_WARM_WORKERS=0``
   for one process per compile) and the XLA compile alone (from the compiler log), then the run
   time of each executable.

Timings use ``time.perf_counter``: median (and min) over repetitions, variants interleaved so load
spikes hit them alike. Prints tables; asserts nothing on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from figures import figure, load, per_call_us  # noqa: E402
from neuron_args import xla_cpu  # noqa: E402
from neuron_args.cache import CompileCache  # noqa: E402
from neuron_args.compilers import select_compiler  # noqa: E402
from neuron_args.lowering.hlo import TensorSpec, lower_fx_graph  # noqa: E402
from neuron_args.runtime import LoadedExecutable  # noqa: E402
from neuron_args.tensors import tensor_to_numpy  # noqa: E402
from neuron_args import executables  # noqa: E402
from neuron_args.seams import backends  # noqa: E402
from tests.models import decoder_inputs, make_decoder, make_mlp, mlp_inputs  # noqa: E402
from tests.xla_run import execute  # noqa: E402

BASE = ["--auto-cast=none", "-O1"]




def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def row(name: str, values: Sequence[float], unit: str, note: str = "") -> None:
    print(f"  {name:<60} {med(values):>10.1f} {min(values):>10.1f} {unit:<3} {note}")


def header(title: str) -> None:
    print(f"{title:<64} {'median':>10} {'min':>10}")


def specs(raw: Sequence[dict[str, Any]]) -> list[TensorSpec]:
    return [TensorSpec(tuple(s["shape"]), s["dtype"]) for s in raw]


# -- 1. hit path -------------------------------------------------------------------------------
def _floor_backend(outputs: Sequence[torch.Tensor]) -> Any:
    """aot_autograd with a forward that returns preallocated outputs: what torch.compile costs alone."""
    from torch._dynamo.backends.common import aot_autograd

    def fw_compiler(fx_gm: torch.fx.GraphModule, fw_inputs: Sequence[Any]) -> Any:
        def run(args: list[Any]) -> list[torch.Tensor]:
            return list(outputs)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    return aot_autograd(fw_compiler=fw_compiler)


def async_client_executable(blob: bytes) -> Any:
    """The executable on jax's asynchronous XLA:CPU client (what the runtime used before the sync client)."""
    return xla_cpu.deserialize_executable(blob, xla_cpu.cpu_client())


@contextlib.contextmanager
def variants_running(cg: backends.CompiledGraph, run: Callable[[list[Any]], Any]) -> Any:
    """Point every variant of ``cg`` at ``run`` for a while (Dynamo shares one CompiledGraph per
    graph across compiled copies of a model, so this is the only way to route its calls)."""
    saved = dict(cg._variants)
    cg._variants = {k: run for k in saved}
    try:
        yield
    finally:
        cg._variants = saved


def in_call_breakdown(cm_call: Callable[[], Any], calls: int, reps: int) -> dict[str, list[float]]:
    """Accumulate, inside the compiled model's own calls, the time spent at each layer (µs per call)."""
    from neuron_args import runtime

    spent = {"cg": 0.0, "exe": 0.0, "execute": 0.0}
    originals = (backends.CompiledGraph.__call__, runtime.LoadedExecutable.__call__)
    loaded = list(executables._loaded.values())

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    backends.CompiledGraph.__call__ = timed("cg", originals[0])  # type: ignore[method-assign]
    runtime.LoadedExecutable.__call__ = timed("exe", originals[1])  # type: ignore[method-assign]
    for exe in loaded:  # the executable's execute_sharded, as LoadedExecutable calls it
        exe._execute = timed("execute", exe.executable.execute_sharded)
    out: dict[str, list[float]] = {"total": [], "outside": [], "dispatch": [], "convert": [], "execute": []}
    try:
        for _ in range(reps):
            for k in spent:
                spent[k] = 0.0
            t0 = time.perf_counter()
            for _ in range(calls):
                cm_call()
            total = time.perf_counter() - t0
            for name, value in (("total", total), ("outside", total - spent["cg"]),
                                ("dispatch", spent["cg"] - spent["exe"]), ("convert", spent["exe"] - spent["execute"]),
                                ("execute", spent["execute"])):
                out[name].append(value / calls * 1e6)
    finally:
        backends.CompiledGraph.__call__, runtime.LoadedExecutable.__call__ = originals  # type: ignore[method-assign]
        for exe in loaded:
            exe._execute = exe.executable.execute_sharded
    return out


def hit_path(title: str, root: Path, make_model: Callable[[], torch.nn.Module], warm_calls: Sequence[tuple[Any, ...]],
             inputs: tuple[Any, ...], calls: int, reps: int, profile: bool) -> dict[str, float]:
    """Time the hit path of the graph ``inputs`` select; ``warm_calls`` compile what comes before."""
    seen: list[tuple[backends.CompiledGraph, list[Any]]] = []
    original_call = backends.CompiledGraph.__call__

    def recording_call(self: backends.CompiledGraph, args: list[Any]) -> Any:  # the flat args aot passes
        seen.append((self, list(args)))
        return original_call(self, args)

    def compiled(model: torch.nn.Module) -> Any:
        return torch.compile(model, backend="neuron_libtorch", options=options, dynamic=False)

    options = {"cache_dir": str(root), "compiler_args": BASE, "target": "trn2", "compiler": "local"}
    model = make_model()
    cm = compiled(model)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for warm in warm_calls:
            cm(*warm)
        cm(*inputs)
        first = time.perf_counter() - t0
        backends.CompiledGraph.__call__ = recording_call  # type: ignore[method-assign]
        try:
            expected = cm(*inputs)
        finally:
            backends.CompiledGraph.__call__ = original_call  # type: ignore[method-assign]
        cg, args = seen[-1]
        wanted = [{"shape": list(s.shape), "dtype": s.dtype} for s in cg.lowered.input_specs]
        entry = next(e for e in CompileCache(root).entries() if e.metadata()["input_specs"] == wanted)
        md = entry.metadata()
        in_specs, out_specs = specs(md["input_specs"]), specs(md["output_specs"])
        exe = LoadedExecutable.from_bytes(entry.executable_path.read_bytes(), in_specs, out_specs)
        exe_sync = LoadedExecutable(async_client_executable(entry.executable_path.read_bytes()), in_specs, out_specs)
        # the client before end to end: while "cm_sync" runs, the graph's variant is the async executable
        on_sync = {"cm_sync": lambda: variants_running(cg, lambda a: exe_sync(*a))}
        arrays = [tensor_to_numpy(a) for a in args]
        floor = torch.compile(make_model(), backend=_floor_backend([o.clone() for o in exe(*args)]), dynamic=False)
        same = (torch.allclose(exe(*args)[-1], expected, rtol=1e-5, atol=1e-5)
                and torch.allclose(exe_sync(*args)[-1], expected, rtol=1e-5, atol=1e-5))

        fns: dict[str, Callable[[], Any]] = {
            "cm": lambda: cm(*inputs),
            "floor": lambda: floor(*inputs),
            "cg": lambda: cg(args),
            "exe": lambda: exe(*args),
            "execute": lambda: execute(exe.executable, arrays),
            "eager": lambda: model(*inputs),
            "cm_sync": lambda: cm(*inputs),
            "exe_sync": lambda: exe_sync(*args),
            "execute_sync": lambda: execute(exe_sync.executable, arrays),
        }
        for name, fn in fns.items():  # warm-up (the floor compiles here)
            with on_sync.get(name, contextlib.nullcontext)():
                for _ in range(30):
                    fn()
        times = per_call_us(fns, calls, reps, on_sync)
        inside = in_call_breakdown(lambda: cm(*inputs), calls, max(3, reps // 3))

    print(f"1{title}\n   ({reps} reps x {calls} calls, interleaved; first call incl. lower+compile {first:.1f} s; "
          f"executables agree with the compiled model: {same})")
    header("   per call")
    row("compiled model cm(...)  [Dynamo + aot wrapper + below]", times["cm"], "us")
    row("CompiledGraph cg(args) [variant dispatch + below]", times["cg"], "us")
    row("LoadedExecutable exe(*args) [conversions + below]", times["exe"], "us")
    row("xla_cpu.execute(executable, numpy arrays)", times["execute"], "us")
    row("torch.compile floor: Dynamo + aot, graph does nothing", times["floor"], "us")
    row("eager model (reference)", times["eager"], "us")
    row("before: compiled model, its variant on jax's async client", times["cm_sync"], "us")
    row("before: LoadedExecutable on jax's async client", times["exe_sync"], "us")
    row("before: xla_cpu.execute on jax's async client", times["execute_sync"], "us")
    m = {k: med(v) for k, v in times.items()}
    lo = {k: min(v) for k, v in times.items()}
    ratio = m["cm"] / m["exe"]
    print(f"   ratio compiled model / loaded executable: {ratio:.2f} median, {lo['cm'] / lo['exe']:.2f} min  "
          f"(target <= 1.10: {'met' if ratio <= 1.10 else 'MISSED'})")
    print(f"   ratio CompiledGraph / loaded executable:  {m['cg'] / m['exe']:.2f} median, {lo['cg'] / lo['exe']:.2f} min")
    print(f"   on jax's async client: compiled / loaded {m['cm_sync'] / m['exe_sync']:.2f}; the sync client makes the "
          f"compiled model {m['cm_sync'] / m['cm']:.2f}x and xla_cpu.execute {m['execute_sync'] / m['execute']:.2f}x faster")
    b = {k: med(v) for k, v in inside.items()}
    print(f"   breakdown inside cm(...) calls (median of {len(inside['total'])} x {calls}; µs per call, "
          f"{b['total']:.1f} total): Dynamo guards + aot runtime wrapper {b['outside']:.1f} "
          f"({b['outside'] / b['total']:.0%}), CompiledGraph dispatch {b['dispatch']:.1f}, "
          f"LoadedExecutable conversions {b['convert']:.1f}, execute_sharded {b['execute']:.1f}")
    if profile:
        with torch.inference_mode():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls * 5):
                cm(*inputs)
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
        print("\n   cProfile of the compiled model's call, by own time (cProfile inflates Python-heavy frames):")
        print("\n".join("   " + line for line in buf.getvalue().splitlines()[:40] if line.strip()))
    print()
    return {"ratio": ratio, "ratio_sync": m["cm_sync"] / m["exe_sync"]}


# -- 2. decoder: lowering, compile and run at -O1 vs -O3 ---------------------------------------
def capture_decoder_graph() -> tuple[torch.fx.GraphModule, list[Any], float]:
    """The aot forward graph the seam would lower (custom backend; first lowering timed)."""
    from torch._dynamo.backends.common import aot_autograd

    captured: list[tuple[torch.fx.GraphModule, list[Any], float]] = []

    def fw_compiler(fx_gm: torch.fx.GraphModule, fw_inputs: Sequence[Any]) -> Any:
        t0 = time.perf_counter()
        lower_fx_graph(fx_gm, fw_inputs)  # first lowering: jax/torchax start-up included
        captured.append((fx_gm, list(fw_inputs), time.perf_counter() - t0))
        return fx_gm

    model = make_decoder()
    tokens, pos = decoder_inputs(seq=5)
    cm = torch.compile(model, backend=aot_autograd(fw_compiler=fw_compiler), dynamic=False)
    with torch.inference_mode():
        cm(tokens, pos)
    return captured[0]


def compile_level(lowered: Any, level: int, workdir: Path) -> tuple[float, float, float, Path]:
    """Wall seconds of the local compiler (its warm worker), plus its own jax-start and XLA-compile seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    hlo = workdir / "graph.hlo"
    hlo.write_bytes(lowered.hlo_module_proto)
    out = workdir / "graph.neff"
    result = select_compiler("local").compile(
        hlo_path=hlo, output_path=out, target="trn2", compiler_args=["--auto-cast=none", f"-O{level}"],
        workdir=workdir)
    log = result.log_path.read_text()
    jax_start = float(re.findall(r"jax startup seconds: ([0-9.]+)", log)[-1])
    xla = float(re.findall(r"compile seconds: ([0-9.]+)", log)[-1])
    return result.seconds, jax_start, xla, out


def sample_inputs(input_specs: Sequence[TensorSpec], vocab: int = 128) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for s in input_specs:
        if s.torch_dtype.is_floating_point:
            out.append(torch.randn(s.shape, generator=g).to(s.torch_dtype))
        else:  # token ids / positions: in range for every index in the graph
            out.append(torch.randint(0, 5, s.shape, generator=g, dtype=s.torch_dtype))
    return out


def decoder(root: Path, compile_reps: int, calls: int, reps: int) -> None:
    gm, fw_inputs, first_lower = capture_decoder_graph()
    lower_times = []
    lowered = None
    for _ in range(compile_reps + 2):
        t0 = time.perf_counter()
        lowered = lower_fx_graph(gm, fw_inputs)
        lower_times.append((time.perf_counter() - t0) * 1e3)
    assert lowered is not None
    walls: dict[int, list[float]] = {1: [], 3: []}
    jax_starts: dict[int, list[float]] = {1: [], 3: []}
    xlas: dict[int, list[float]] = {1: [], 3: []}
    exes: dict[int, Path] = {}
    for rep in range(compile_reps):
        for level in (1, 3):
            wall, jax_start, xla, out = compile_level(lowered, level, root / f"O{level}-{rep}")
            walls[level].append(wall)
            jax_starts[level].append(jax_start)
            xlas[level].append(xla)
            exes[level] = out
    loaded = {lvl: LoadedExecutable.from_bytes(p.read_bytes(), lowered.input_specs, lowered.output_specs)
              for lvl, p in exes.items()}
    inputs = sample_inputs(lowered.input_specs)
    with torch.inference_mode():
        o1, o3 = loaded[1](*inputs), loaded[3](*inputs)
        agree = max(float((a - b).abs().max()) for a, b in zip(o1, o3) if a.is_floating_point())
        run = per_call_us({1: lambda: loaded[1](*inputs), 3: lambda: loaded[3](*inputs)}, calls, reps)

    n_nodes = sum(1 for _ in gm.graph.nodes)
    print(f"2. decoder block, prefill T=5 ({n_nodes} FX nodes, {len(lowered.input_specs)} graph inputs, "
          f"HLO proto {len(lowered.hlo_module_proto)} B, {compile_reps} compiles per level)")
    header("   lowering (lower_fx_graph; independent of -O)")
    row("first lowering of this graph (jax already started by part 1)", [first_lower * 1e3], "ms")
    row("lower_fx_graph, warm", lower_times, "ms")
    header("   compile (local compiler on its warm worker; the first compile starts it)")
    for level in (1, 3):
        row(f"-O{level}: compiler wall time", walls[level], "s")
        row(f"-O{level}:   of which jax start-up in the worker", jax_starts[level], "s")
        row(f"-O{level}:   of which XLA:CPU compile", xlas[level], "s")
    header(f"   run (LoadedExecutable, {reps} reps x {calls} calls)")
    for level in (1, 3):
        row(f"-O{level} executable per call", run[level], "us")
    r = med(run[1]) / med(run[3])
    print(f"   -O3 run speed-up over -O1: {r:.2f}x ({'faster' if r > 1.05 else 'no measurable gain' if r > 0.95 else 'slower'}"
          f"); compile cost -O3/-O1 (XLA compile): {med(xlas[3]) / med(xlas[1]):.2f}x; outputs agree to {agree:.1e}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--profile", action="store_true", help="cProfile the compiled model's call")
    parser.add_argument("--skip-decoder", action="store_true", help="only the hit-path part")
    ns = parser.parse_args()
    calls, reps = (100, 5) if ns.quick else (200, 15)
    torch.set_num_threads(1)  # spinning OpenMP threads on a busy 2-core machine make every row noisy
    print(f"bench_compile: {load()} (start); torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)")
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        mlp = hit_path(".1 hit path, MLP 4x32 -> 64 -> 16", Path(tmp) / "mlp", make_mlp, [], mlp_inputs(batch=4),
                       calls, reps, ns.profile)
        figure("bench_compile: whole torch.compile'd call / loaded executable, MLP", mlp["ratio"], "<= 1.10")
        print(f"   ({load()})\n")
        dec = hit_path(".2 hit path, decoder block decode step (T=1, after a T=5 prefill; aot copies the KV buffers back)",
                       Path(tmp) / "decoder-hit", make_decoder, [decoder_inputs(seq=5)], decoder_inputs(seq=1, start=5),
                       calls // 2, reps, ns.profile)
        figure("bench_compile: whole torch.compile'd call / loaded executable, decode step", dec["ratio"], "<= 1.10")
        print(f"   ({load()})\n")
        if not ns.skip_decoder:
            decoder(Path(tmp) / "decoder", 1 if ns.quick else 3, calls, reps)
    print(f"bench_compile: {load()} (end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
