"""The trace memo: a warm re-trace whose predicted key is built skips aot_autograd and the lowering.

Counted, not timed: every test counts the calls of ``lower_fx_graph`` and of ``aot_autograd``, and
compares keys, records, ledger lines and outputs with the full path (``NEURON_ARGS_TRACE_MEMO=0``)
and with eager PyTorch. Then every way the memo must not be used: another constant, parameter
shape, dtype or grad mode, a corrupt memo file, a missing or corrupt entry, another scope, the
switch off; and a fresh process using the memo another process wrote.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_args import CacheMissError, scoped_compiler_args
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.deferred import parallel_compile
from neuron_args.fastpath import ENV as FASTPATH_ENV
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.seams import records, trace_memo
from tests.models import decoder_inputs, make_decoder, make_mlp, mlp_inputs

REPO = Path(__file__).resolve().parents[1]
BASE = ["--auto-cast=none", "-O1"]
O3 = ["--auto-cast=none", "-O3"]


def compile_(model, cache, backend="neuron_libtorch"):
    options = {"cache_dir": str(cache), "compiler": "local", "compiler_args": BASE, "target": "trn2"}
    return torch.compile(model, backend=backend, dynamic=False, options=options)


class Counts:
    """Calls of the lowering and of aot_autograd since the last ``take()``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch._dynamo.backends.common as common

        from neuron_args.lowering import hlo

        self.lower = self.aot = 0
        real_lower, real_aot = hlo.lower_fx_graph, common.aot_autograd

        def lower(*a, **k):
            self.lower += 1
            return real_lower(*a, **k)

        def aot(**kw):
            inner = real_aot(**kw)

            def run(*a, **k):
                self.aot += 1
                return inner(*a, **k)

            return run

        monkeypatch.setattr(hlo, "lower_fx_graph", lower)
        monkeypatch.setattr(common, "aot_autograd", aot)

    def take(self) -> tuple[int, int]:
        out, self.lower, self.aot = (self.lower, self.aot), 0, 0
        return out


@pytest.fixture
def counts(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(trace_memo.ENV, raising=False)
    fresh()
    return Counts(monkeypatch)


def fresh() -> None:
    """A new trace, as in a new process: Dynamo forgets its graphs, the process its records."""
    torch._dynamo.reset()
    ACTIVITY.reset()


def memo_files(cache: Path) -> list[Path]:
    return sorted(CompileCache(cache).trace_memo_dir.glob("*.json"))


def rows() -> list[dict]:
    return sorted((r.to_json() for r in records.records()), key=lambda d: d["key"])


@pytest.fixture(scope="module")
def mlp_built(tmp_path_factory) -> tuple[Path, str]:
    """A cache with the MLP built at the base arguments (and its memo written by that full trace); its key."""
    root = tmp_path_factory.mktemp("memo-mlp")
    fresh()
    with torch.inference_mode():
        compile_(make_mlp(), root)(*mlp_inputs())
    assert len(memo_files(root)) == 1
    (entry,) = CompileCache(root).entries()
    return root, entry.key


@pytest.fixture
def mlp_cache(mlp_built) -> Path:
    return mlp_built[0]


def run_mlp(cache: Path, model=None) -> torch.Tensor:
    fresh()
    with torch.inference_mode():
        return compile_(model or make_mlp(), cache)(*mlp_inputs())


def test_a_memo_hit_skips_aot_and_lowering_with_the_keys_records_and_ledger_of_the_full_path(
        mlp_cache, counts, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "full"))
    monkeypatch.setenv(trace_memo.ENV, "0")
    full = run_mlp(mlp_cache)
    assert counts.take() == (1, 1)
    full_rows = rows()

    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "memo"))
    monkeypatch.delenv(trace_memo.ENV)
    memo = run_mlp(mlp_cache)
    assert counts.take() == (0, 0), "a memo hit neither runs aot_autograd nor lowers"
    assert rows() == full_rows and full_rows[0]["loads"] == 1 and full_rows[0]["compiles"] == 0
    ledgers = [[line for f in sorted((tmp_path / run).rglob("*.jsonl")) for line in f.read_text().splitlines()]
               for run in ("full", "memo")]
    assert len(ledgers[0]) == 1 and ledgers[0] == ledgers[1] and full_rows[0]["key"] in ledgers[0][0]
    assert torch.equal(memo, full)
    torch.testing.assert_close(memo, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)
    assert len(memo_files(mlp_cache)) == 1, "the full path of a known graph writes no second memo"


@pytest.mark.slow
def test_the_decoder_decode_steps_mutate_the_kv_cache_as_eager_does(tmp_path, counts):
    def steps(cache: Path) -> tuple[list[torch.Tensor], torch.nn.Module]:
        fresh()
        model = make_decoder()
        cm = compile_(model, cache)
        outs = []
        with torch.inference_mode():
            outs.append(cm(*decoder_inputs(seq=5)))
            for pos in range(5, 9):
                outs.append(cm(*decoder_inputs(seq=1, start=pos)))
        return outs, model

    full, _ = steps(tmp_path)
    assert counts.take() == (2, 2)
    memo, model = steps(tmp_path)
    assert counts.take() == (0, 0), "prefill and decode both come from the memo"
    reference = make_decoder()
    with torch.inference_mode():
        want = [reference(*decoder_inputs(seq=5))] + [reference(*decoder_inputs(seq=1, start=p)) for p in range(5, 9)]
    for got, exact, ref in zip(memo, full, want):
        assert torch.equal(got, exact)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.k_cache, reference.k_cache, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.v_cache, reference.v_cache, rtol=1e-5, atol=1e-5)
    assert model.k_cache[:, :, 8].abs().sum() > 0, "the last step wrote its position through the copy-back"


class Scaled(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.mlp, self.scale = make_mlp(), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) * self.scale


@pytest.mark.slow
@pytest.mark.parametrize("change", ["constant", "parameter shape", "dtype", "grad mode"])
def test_a_changed_trace_does_not_use_the_memo(mlp_cache, counts, change):
    run_mlp(mlp_cache)
    assert counts.take() == (0, 0)
    fresh()
    if change == "constant":  # a Python constant is baked into the graph's code
        base, other = Scaled(2.0), Scaled(3.0)
        with torch.inference_mode():
            compile_(base, mlp_cache)(*mlp_inputs())
            counts.take()
            fresh()
            out = compile_(other, mlp_cache)(*mlp_inputs())
        torch.testing.assert_close(out, other(*mlp_inputs()), rtol=1e-5, atol=1e-5)
    elif change == "parameter shape":
        run_mlp(mlp_cache, make_mlp(d_hidden=48))
    elif change == "dtype":
        fresh()
        with torch.inference_mode():
            compile_(make_mlp(dtype=torch.bfloat16), mlp_cache)(*mlp_inputs(dtype=torch.bfloat16))
    else:  # grad on, no input requires grad: a plain graph, but traced in another mode
        model = make_mlp().requires_grad_(False)
        compile_(model, mlp_cache)(*mlp_inputs())
    assert counts.take() == (1, 1)


def test_the_fingerprint_holds_graph_constants_input_layouts_and_modes():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.add, (x, graph.get_attr("c"))))
    gm = torch.fx.GraphModule({"c": torch.ones(3)}, graph)
    x = torch.zeros(3)
    base = trace_memo.fingerprint(gm, [x])
    assert base is not None and base == trace_memo.fingerprint(copy.deepcopy(gm), [torch.ones(3)])
    gm.c = torch.full((3,), 2.0)
    assert trace_memo.fingerprint(gm, [x]) != base, "a get_attr tensor's values"
    gm.c = torch.ones(3)
    assert trace_memo.fingerprint(gm, [torch.zeros(6)[::2]]) != base, "an input's stride"
    assert trace_memo.fingerprint(gm, [torch.zeros(3, dtype=torch.float64)]) != base
    assert trace_memo.fingerprint(gm, [torch.zeros(3, requires_grad=True)]) != base
    with torch.no_grad():
        assert trace_memo.fingerprint(gm, [x]) != base
    with torch.inference_mode():
        assert trace_memo.fingerprint(gm, [x]) != base
    seen = []
    for body in ("x + 1", "x + 2"):  # a Python function of the user's in the graph: its code counts
        namespace: dict = {"__name__": "user_model"}
        exec(f"def scale(x):\n    return {body}\n", namespace)
        g = torch.fx.Graph()
        g.output(g.call_function(namespace["scale"], (g.placeholder("x"),)))
        seen.append(trace_memo.fingerprint(torch.fx.GraphModule({}, g), [x]))
    assert None not in seen and seen[0] != seen[1]
    del gm.c
    gm.c = object()
    assert trace_memo.fingerprint(gm, [x]) is None, "a constant it cannot pin down: no memo"


def test_the_fingerprint_reads_a_lazy_graph_modules_source_without_compiling_its_forward():
    from torch.fx._lazy_graph_module import _LazyGraphModule

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.mul, (graph.call_function(torch.add, (x, graph.get_attr("c"))), x)))
    gm = _LazyGraphModule({"c": torch.ones(3)}, graph)  # what Dynamo hands a backend
    assert gm._needs_recompile()
    fp = trace_memo.fingerprint(gm, [torch.zeros(3)])
    assert gm._needs_recompile(), "a memo hit never runs the graph module: its forward is not generated for the key"
    # the same fingerprint as from the compiled module's code (memos written before stay valid)
    assert gm.code == graph.python_code(root_module="self").src and not gm._needs_recompile()
    assert trace_memo.fingerprint(gm, [torch.zeros(3)]) == fp is not None


def _scaled(x, factor=1.0):
    return x * factor


def _closure(fn):
    def lowering(x):
        return fn(x)
    return lowering


def test_registered_lowerings_count_by_what_they_run_not_by_their_address():
    digest = trace_memo._callable_digest
    # two equal partials or closures made apart (another process makes its own) digest alike
    assert digest(functools.partial(_scaled, factor=2.0)) == digest(functools.partial(_scaled, factor=2.0))
    assert digest(functools.partial(_scaled, factor=2.0)) != digest(functools.partial(_scaled, factor=3.0))
    assert digest(_closure(abs)) == digest(_closure(abs))
    assert digest(_closure(abs)) != digest(_closure(_scaled)), "a closure's cells count"


@pytest.mark.slow
def test_a_corrupt_memo_file_is_ignored_and_rewritten(tmp_path, counts):
    mlp_cache = tmp_path
    run_mlp(mlp_cache)
    counts.take()
    (path,) = memo_files(mlp_cache)
    good = path.read_text()
    as_dict = json.loads(good)
    wrong_plan = {**as_dict["plan"], "mutated": [[99, 0, False]]}
    for garbage in ("", "{not json", json.dumps({**as_dict, "graph_sha256": 5}), good[: len(good) // 2],
                    json.dumps({**as_dict, "plan": wrong_plan}), json.dumps({**as_dict, "input_specs": []})):
        path.write_text(garbage)
        out = run_mlp(mlp_cache)
        assert counts.take() == (1, 1)
        assert path.read_text() == good
        torch.testing.assert_close(out, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_missing_or_corrupt_entry_takes_the_full_path_and_is_rebuilt(tmp_path, counts):
    run_mlp(tmp_path)
    (entry,) = CompileCache(tmp_path).entries()
    key = entry.key
    counts.take()
    shutil.rmtree(entry.path)
    run_mlp(tmp_path)
    assert counts.take() == (1, 1)
    assert [(r["key"], r["compiles"]) for r in rows()] == [(key, 1)] and entry.status == "complete"

    entry.executable_path.write_bytes(b"torn")  # caught by the entry's checksum
    out = run_mlp(tmp_path)
    assert counts.take() == (1, 1)
    assert [(r["key"], r["compiles"]) for r in rows()] == [(key, 1)] and entry.problem() is None
    torch.testing.assert_close(out, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_two_scopes_on_one_graph_get_two_keys_the_second_lowered_when_it_misses(tmp_path, counts, monkeypatch):
    model, (x,) = make_mlp(), mlp_inputs()
    run_mlp(tmp_path)
    counts.take()
    fresh()
    cm = compile_(model, tmp_path)
    with torch.inference_mode():
        cm(x)
        assert counts.take() == (0, 0)
        with scoped_compiler_args(O3, graph_type="decode"):
            o3 = cm(x)
        assert counts.take() == (1, 1), "the -O3 key misses: aot and the lowering run then"
    keys = {r["compiler_args"][-1]: r["key"] for r in rows()}
    assert sorted(keys) == ["-O1", "-O3"] and keys["-O1"] != keys["-O3"]
    assert [r["compiles"] for r in rows() if r["key"] == keys["-O3"]] == [1]
    torch.testing.assert_close(o3, model(x), rtol=1e-5, atol=1e-5)

    # the full path gives the same -O3 key (and finds it built)
    monkeypatch.setenv(trace_memo.ENV, "0")
    fresh()
    with torch.inference_mode(), scoped_compiler_args(O3, graph_type="decode"):
        compile_(make_mlp(), tmp_path)(x)
    assert [(r["key"], r["loads"]) for r in rows()] == [(keys["-O3"], 1)]


def test_a_memo_hit_reads_the_executable_once(mlp_built, counts, monkeypatch):
    """Trusting the memo's prediction verifies the entry, reading and hashing its executable; the load takes the
    bytes hashed then: one read, no second one for the load."""
    from neuron_args import cache as cache_module
    from neuron_args.untrusted import read_chunks

    root, key = mlp_built
    reads = []
    monkeypatch.setattr(cache_module, "read_chunks", lambda *a: reads.append(a[3]) or read_chunks(*a))
    out = run_mlp(root)
    assert counts.take() == (0, 0) and [(r["key"], r["loads"]) for r in rows()] == [(key, 1)]
    assert reads == [CompileCache(root).entry(key).executable_path]
    torch.testing.assert_close(out, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)


def test_assert_cache_hit_is_unchanged_under_the_memo(mlp_cache, counts, monkeypatch):
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    run_mlp(mlp_cache)  # built: a hit, from the memo
    assert counts.take() == (0, 0)
    fresh()
    cm = compile_(make_mlp(), mlp_cache)
    with torch.inference_mode(), scoped_compiler_args(["--auto-cast=none", "-O2"], graph_type="jf"):
        with pytest.raises(CacheMissError) as err:
            cm(*mlp_inputs())
    (rec,) = rows()
    assert rec["key"] in str(err.value) and "'jf'" in str(err.value)


def test_the_switch_off_traces_in_full(mlp_cache, counts, monkeypatch):
    monkeypatch.setenv(trace_memo.ENV, "0")
    run_mlp(mlp_cache)
    assert counts.take() == (1, 1)


# the start of a fresh process's script: counts the lowerings it runs in n["lower"]
COUNTING_LOWERINGS = """
import json, torch
from neuron_args.lowering import hlo
n = {"lower": 0}
real = hlo.lower_fx_graph
def lower(*a, **k):
    n["lower"] += 1
    return real(*a, **k)
hlo.lower_fx_graph = lower
"""


def run_twice_fresh(script: str) -> list[str]:
    """The last stdout line of ``script`` run in two fresh processes, one after the other."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "VLLM_NEURON"))}
    lines = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", COUNTING_LOWERINGS + script], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
        lines.append(proc.stdout.strip().splitlines()[-1])
    return lines


@pytest.mark.slow
def test_fresh_processes_use_the_memo_another_process_wrote_lapack_graphs_included(tmp_path):
    """Two contracts, one pair of fresh processes (each costs an import of torch and jax):

    - a fresh process uses the memo another process wrote (both fresh: this one's registered lowerings, which
      other tests add to, are not theirs): the second lowers nothing and loads what the first compiled;
    - QR and SVD lower to LAPACK custom calls, whose function table jax's lowering fills: a process that takes
      the graph from the cache and the memo (lowering nothing) fills it before loading (it crashed). The LAPACK
      graph runs first, so nothing this process did before has filled the table.
    """
    mlp_cache, lapack_cache = tmp_path / "mlp", tmp_path / "lapack"
    script = textwrap.dedent(f"""
        from neuron_args.seams import records
        from tests.models import make_mlp, mlp_inputs
        def f(a):
            q, r = torch.linalg.qr(a)
            return q @ r + torch.linalg.svdvals(a).sum()
        x = torch.eye(4) * 2 + torch.arange(16.0).reshape(4, 4) / 10
        cf = torch.compile(f, backend="neuron_libtorch", dynamic=False, options={{
            "cache_dir": {str(lapack_cache)!r}, "compiler": "local", "compiler_args": {BASE!r}, "target": "trn2"}})
        with torch.inference_mode():
            out = cf(x)
        torch.testing.assert_close(out, f(x), rtol=1e-4, atol=1e-4)
        lapack = "lowered" if n["lower"] else "from the memo"
        lapack_keys = {{r.key for r in records.records()}}
        n["lower"] = 0
        cm = torch.compile(make_mlp(), backend="neuron_libtorch", dynamic=False, options={{
            "cache_dir": {str(mlp_cache)!r}, "compiler": "local", "compiler_args": {BASE!r}, "target": "trn2"}})
        with torch.inference_mode():
            out = cm(*mlp_inputs())
        torch.testing.assert_close(out, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)
        print(json.dumps({{"lower": n["lower"], "lapack": lapack,
                          "rows": [(r.key, r.compiles, r.loads) for r in records.records()
                                   if r.key not in lapack_keys]}}))
    """)
    got = [json.loads(line) for line in run_twice_fresh(script)]
    (entry,) = CompileCache(mlp_cache).entries()
    assert [g["lapack"] for g in got] == ["lowered", "from the memo"]
    assert [{k: v for k, v in g.items() if k != "lapack"} for g in got] == [
        {"lower": 1, "rows": [[entry.key, 1, 0]]}, {"lower": 0, "rows": [[entry.key, 0, 1]]}]
    assert len(memo_files(mlp_cache)) == 1


def test_graphs_the_capture_seam_traced_are_known_to_the_compile_seam(tmp_path, counts):
    fresh()
    with torch.inference_mode():
        compile_(make_mlp(), tmp_path, backend="neuron_libtorch_graph_capture")(*mlp_inputs())
    assert counts.take() == (1, 1) and len(memo_files(tmp_path)) == 1
    parallel_compile(tmp_path, compiler="local", quiet=True)
    out = run_mlp(tmp_path)
    assert counts.take() == (0, 0)
    torch.testing.assert_close(out, make_mlp()(*mlp_inputs()), rtol=1e-5, atol=1e-5)


class DecoderModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = make_decoder()

    def neuron_graphs(self) -> list[GraphSpec]:
        kw = lambda t, p: {"tokens": t, "input_pos": p}  # noqa: E731
        return [GraphSpec("prefill", self.block, {"t5": lambda: kw(*decoder_inputs(seq=5))}),
                GraphSpec("decode", self.block, {"t1": lambda: kw(*decoder_inputs(seq=1, start=5))})]


@pytest.mark.slow
def test_the_runner_serves_memo_graphs_through_the_fast_path(tmp_path, counts, monkeypatch):
    monkeypatch.delenv(FASTPATH_ENV, raising=False)
    runners = []
    for _ in range(2):
        fresh()
        runner = NeuronRunner(DecoderModel(), compiler_args=BASE, compiler="local", cache_dir=tmp_path)
        runner.warmup(emit=False)
        runners.append((runner, counts.take()))
    (_, cold), (runner, warm) = runners
    assert cold == (2, 2) and warm == (0, 0)
    assert runner.fast_path.refused == {} and sorted(runner.fast_path.graphs) == ["decode", "prefill"]
    block = runner.model.block
    block.reset_cache()
    reference = make_decoder()
    fast = runner.fast_path.graphs["decode"][0]
    with runner.serve(), torch.inference_mode():
        torch.testing.assert_close(runner.run("prefill", {"tokens": decoder_inputs(seq=5)[0],
                                                          "input_pos": decoder_inputs(seq=5)[1]}),
                                   reference(*decoder_inputs(seq=5)), rtol=1e-4, atol=1e-4)
        for pos in range(5, 8):
            t, p = decoder_inputs(seq=1, start=pos)
            torch.testing.assert_close(runner.run("decode", {"tokens": t, "input_pos": p}), reference(t, p),
                                       rtol=1e-4, atol=1e-4)
    assert fast.calls == 3
    torch.testing.assert_close(block.k_cache, reference.k_cache, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_tiny_hf_llama_from_the_memo_matches_eager(tmp_path, counts):
    pytest.importorskip("transformers", reason="the Hugging Face model needs transformers (pip install -e '.[hf]')")
    from tests.hf.architectures import DECODERS, token_ids

    build = next(a for a in DECODERS if a.name == "llama-sdpa").build
    ids = token_ids(1, 8)
    outs = []
    for _ in range(2):
        fresh()
        with torch.inference_mode():
            outs.append(compile_(build(), tmp_path)(ids).logits)
    assert counts.take()[0] == 1, "the second trace lowered nothing"
    with torch.inference_mode():
        want = build()(ids).logits
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], want, rtol=1e-4, atol=1e-4)


def test_prune_memo_removes_what_no_warm_trace_can_use(tmp_path, mlp_built, capsys):
    from neuron_args.cli import main

    cache = tmp_path / "cache"
    shutil.copytree(mlp_built[0], cache)  # other tests of this module add entries and memos: keep the MLP's
    digest = CompileCache(cache).entry(mlp_built[1]).metadata()["key_components"]["graph"]
    for entry in CompileCache(cache).entries():
        if entry.key != mlp_built[1]:
            shutil.rmtree(entry.path)
    memo = next(p for p in memo_files(cache) if json.loads(p.read_text())["graph_sha256"] == digest)
    for other in set(memo_files(cache)) - {memo}:
        other.unlink()
    folder = memo.parent
    orphan = folder / ("0" * 64 + ".json")  # a well-formed memo whose graph no entry has (an edited model's)
    orphan.write_text(json.dumps({**json.loads(memo.read_text()), "fingerprint": orphan.stem, "graph_sha256": "1" * 64}))
    (folder / "foreign.json").write_text("{not json")
    writing, stale_tmp = folder / ".a.json.x1.tmp", folder / ".b.json.x2.tmp"
    writing.write_text("")
    stale_tmp.write_text("")
    os.utime(stale_tmp, (0, 0))

    def prune(*extra):
        assert main(["cache", "prune-memo", str(cache), "--json", *extra]) == 0
        return {p["file"]: p["reason"] for p in json.loads(capsys.readouterr().out)["pruned"]}

    expected = {orphan.name: "no entry", "foreign.json": "unreadable", stale_tmp.name: "unreadable"}
    assert prune("--dry-run") == expected
    assert orphan.exists() and stale_tmp.exists()
    assert prune() == expected
    assert sorted(p.name for p in folder.iterdir()) == sorted([memo.name, writing.name])
    assert prune() == {}

    # --older-than goes by the last read: trace_memo.load touches the file
    old = 10 * 86400
    os.utime(memo, (memo.stat().st_atime - old, memo.stat().st_mtime - old))
    assert trace_memo.load(CompileCache(cache), memo.stem) is not None
    assert prune("--older-than", "5") == {}
    os.utime(memo, (memo.stat().st_atime - old, memo.stat().st_mtime - old))
    assert prune("--older-than", "5", "--dry-run") == {memo.name: "unused"}

    shutil.rmtree(CompileCache(cache).entry(mlp_built[1]).path)  # the entry is gone: its memo predicts nothing
    assert prune() == {memo.name: "no entry"}
    assert main(["cache", "prune-memo", str(tmp_path / "nowhere")]) == 2


def test_a_custom_ops_python_decomposition_is_in_the_fingerprint_and_a_cpp_held_one_gives_no_memo():
    lib = torch.library.Library("neuron_args_memo_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("held(Tensor x) -> Tensor")
    lib.impl("held", lambda x: x * 2, "CompositeImplicitAutograd")  # the dispatcher (C++) keeps the function
    twice, held = torch.ops.neuron_args_memo_test.twice.default, torch.ops.neuron_args_memo_test.held.default
    cia = torch._C.DispatchKey.CompositeImplicitAutograd

    def fingerprint(op):
        g = torch.fx.Graph()
        g.output(g.call_function(op, (g.placeholder("x"),)))
        return trace_memo.fingerprint(torch.fx.GraphModule({}, g), [torch.zeros(3)])

    seen = []
    try:
        for body in ("x * 2", "x + x", "x * 2"):  # the user edits the decomposition, then reverts the edit
            namespace: dict = {"__name__": "user_ops"}
            exec(f"def twice(x):\n    return {body}\n", namespace)
            twice.py_kernels.pop(cia, None)
            twice.py_impl(cia)(namespace["twice"])
            seen.append(fingerprint(twice))
        assert None not in seen and seen[0] != seen[1] and seen[0] == seen[2]
        assert fingerprint(held) is None
        assert fingerprint(torch.ops.aten.relu.default) is not None  # torch's own ops: by torch's version
    finally:
        twice.py_kernels.pop(cia, None)
        lib._destroy()
