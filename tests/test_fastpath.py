"""The serve fast path: warmed calls replay their compiled variant without Dynamo, and only when exact.

Correctness against eager and against the guarded path (KV caches and logits over many decode
steps, the tiny VLM's generation), then every way a call must fall back to the guarded path:
another shape, failed guards (a module attribute, an input layout), module hooks, a Dynamo reset,
and the calls that are not served fast at all (graph breaks, changed guarded values, aliased outputs).
"""
from __future__ import annotations

import copy

import pytest
import torch

from neuron_args import CacheMissError
from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.fastpath import ENV, MISS, FastGraph, FastPath
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.seams.backends import CAPTURE_SEAM
from tests.models import decoder_inputs, make_decoder
from tests.python_calls import python_calls

BASE = ["--auto-cast=none", "-O1"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _no_assert(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(ENV, raising=False)


def kw(tokens: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"tokens": tokens, "input_pos": pos}


class DecoderModel(torch.nn.Module):
    """tests/models.py's decoder block (batch 2) as a runner model: prefill T=5 and decode T=1."""

    def __init__(self) -> None:
        super().__init__()
        self.block = make_decoder()

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("prefill", self.block, {"t5": lambda: kw(*decoder_inputs(seq=5))}),
                GraphSpec("decode", self.block, {"t1": lambda: kw(*decoder_inputs(seq=1, start=5))})]


@pytest.fixture(scope="module")
def decoder_runner(tmp_path_factory) -> NeuronRunner:
    torch._dynamo.reset()
    runner = NeuronRunner(DecoderModel(), compiler_args=BASE, compiler="local",
                          cache_dir=tmp_path_factory.mktemp("fastpath-decoder"))
    runner.warmup(emit=False)
    return runner


def decode(runner: NeuronRunner | None, model: torch.nn.Module, steps: int, check=None) -> list[torch.Tensor]:
    """Greedy prefill + ``steps`` decode steps through ``runner`` (or the eager ``model``)."""
    call = (lambda g, k: runner.run(g, k)) if runner is not None else (lambda g, k: model(**k))
    logits = []
    with torch.inference_mode():
        out = call("prefill", kw(*decoder_inputs(seq=5)))
        logits.append(out)
        token = out[:, -1:].argmax(-1)
        for pos in range(5, 5 + steps):
            out = call("decode", kw(token, torch.tensor([pos])))
            logits.append(out)
            token = out.argmax(-1)
            if check is not None:
                check(pos)
    return logits


@pytest.mark.slow
def test_decode_steps_match_eager_logits_and_kv_cache(decoder_runner):
    block = decoder_runner.model.block
    block.reset_cache()
    reference = copy.deepcopy(block)  # eager PyTorch: same weights, its own cache
    fast = decoder_runner.fast_path.graphs["decode"][0]
    before, steps = fast.calls, 26

    def same_caches() -> None:
        torch.testing.assert_close(block.k_cache, reference.k_cache, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(block.v_cache, reference.v_cache, rtol=1e-5, atol=1e-5)

    with decoder_runner.serve() as served, torch.inference_mode():
        tokens, pos = decoder_inputs(seq=5)
        want = reference(tokens, pos)
        torch.testing.assert_close(decoder_runner.run("prefill", kw(tokens, pos)), want, rtol=1e-4, atol=1e-4)
        same_caches()
        token = want[:, -1:].argmax(-1)
        for p in range(5, 5 + steps):
            position = torch.tensor([p])
            got, want = decoder_runner.run("decode", kw(token, position)), reference(token, position)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            same_caches()
            assert block.k_cache[:, :, p].abs().sum() > 0, "the step wrote its position into the cache"
            token = want.argmax(-1)
    assert decoder_runner.fast_path.refused == {}
    assert fast.calls - before == steps, "every decode step went through the fast path"
    assert served.calls == {"prefill": 1, "decode": steps}
    assert (served.counts.misses, served.counts.compiles) == (0, 0)


def test_fast_and_guarded_paths_give_identical_results(decoder_runner):
    """The same executable either way: bit-identical logits and caches over many steps."""
    block = decoder_runner.model.block
    block.reset_cache()
    fast_logits = decode(decoder_runner, block, 20)
    fast_cache = block.k_cache.clone(), block.v_cache.clone()
    block.reset_cache()
    decoder_runner.fast_path.enabled, saved = False, decoder_runner.fast_path.graphs
    decoder_runner.fast_path.graphs = {}
    try:
        guarded_logits = decode(decoder_runner, block, 20)
    finally:
        decoder_runner.fast_path.enabled, decoder_runner.fast_path.graphs = True, saved
    assert all(torch.equal(a, b) for a, b in zip(fast_logits, guarded_logits))
    assert torch.equal(fast_cache[0], block.k_cache) and torch.equal(fast_cache[1], block.v_cache)


@pytest.mark.slow
def test_tiny_vlm_generation_is_served_fast_and_matches_eager(tmp_path_factory):
    """Four graph types, three on one entry with different compiler arguments (variants); KV slots by index_put."""
    from examples.tiny_vlm.generate import generate
    from examples.tiny_vlm.model import TinyVLM, TinyVLMConfig

    cfg = TinyVLMConfig(prefill_buckets=(16,), decode_buckets=(4,))
    prompts, forced = [[5, 17, 42, 8, 99, 3], [255] * 4 + [7, 21, 64]], {0: [30, 31]}
    with torch.inference_mode():  # as warmup made its example
        image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    torch._dynamo.reset()
    model = TinyVLM(cfg, seed=0)
    runner = NeuronRunner(model, compiler_args=BASE, compiler="local", cache_dir=tmp_path_factory.mktemp("fastpath-vlm"))
    runner.warmup(emit=False)
    with runner.serve() as served, torch.inference_mode():
        tokens = generate(model, prompts, image=image, max_new_tokens=10, forced=forced, run=runner.run)
    assert tokens == generate(TinyVLM(cfg, seed=0), prompts, image=image, max_new_tokens=10, forced=forced)
    fast_calls = {g: sum(f.calls for f in fs) for g, fs in runner.fast_path.graphs.items()}
    assert fast_calls == served.calls == {"encoder": 1, "prefill": 2, "decode": 9, "jf": 1}
    assert runner.fast_path.refused == {}
    variants = {g: fs[0].run for g, fs in runner.fast_path.graphs.items()}
    assert len({id(v) for v in variants.values()}) == 4, "each graph type replays its own variant"


class Scaled(torch.nn.Module):
    """``fc(x) * scale``: a Python float Dynamo specializes on, so changing it must fail the guards."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8)}})]


def _dynamo_code_names(fn) -> set[str]:
    """The names Dynamo's generated code for ``fn``'s frame reads (every cache entry of its code)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {n for e in _debug_get_cache_entry_list(fn.__code__) for n in e.code.co_names}


_BOOKKEEPING = {"record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit"}


def test_the_runners_graphs_are_generated_without_dynamos_profiler_bookkeeping(decoder_runner):
    """Dynamo's code for the runner's frames skips ``record_pregraph_bytecode_enter/exit`` (~2 us a served call);
    the flag is back on after the runner's traces, so a torch.compile outside a runner keeps it."""
    served_code = decoder_runner.fast_path.graphs["decode"][0].code.__code__.co_names
    assert any(n.startswith("__neuron_args_fast_") for n in served_code), served_code
    assert not _BOOKKEEPING & set(served_code), served_code
    assert torch._dynamo.config.record_runtime_overhead is True

    def outside(x):
        return x * 2 + 1

    torch.compile(outside, backend="eager")(torch.ones(3))
    assert _BOOKKEEPING <= _dynamo_code_names(outside)


def test_the_bookkeeping_flag_is_restored_as_it_was_after_nested_and_threaded_scopes():
    """Off inside, in every thread that enters, whichever leaves first; each thread gets its own value back
    (Dynamo's config is context-local)."""
    import threading

    from neuron_args.eager_fallback import runner_call

    config = torch._dynamo.config
    for before in (True, False):
        with config.patch(record_runtime_overhead=before):
            with runner_call():
                with runner_call():
                    assert config.record_runtime_overhead is False
                assert config.record_runtime_overhead is False
            assert config.record_runtime_overhead is before
            entered, leave, left, seen = threading.Event(), threading.Event(), threading.Event(), {}

            def other_thread():
                seen["before"] = config.record_runtime_overhead
                with runner_call():
                    entered.set()
                    leave.wait(30)
                    seen["inside"] = config.record_runtime_overhead
                seen["after"] = config.record_runtime_overhead
                left.set()

            thread = threading.Thread(target=other_thread)
            thread.start()
            entered.wait(30)
            with runner_call():  # threads leave in any order: off in each until it leaves
                leave.set()
                left.wait(30)
                assert config.record_runtime_overhead is False  # the other thread left first
            thread.join(30)
            assert seen["inside"] is False and seen["after"] is seen["before"]
            assert config.record_runtime_overhead is before


@pytest.fixture(scope="module")
def scaled_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath-scaled")


@pytest.fixture
def scaled(scaled_cache) -> NeuronRunner:
    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, compiler="local", cache_dir=scaled_cache)
    runner.warmup(emit=False)
    assert len(runner.fast_path.graphs["decode"]) == 1
    return runner


def inp(*shape: int) -> torch.Tensor:
    """An input as serving makes them (an inference tensor, like warmup's examples)."""
    with torch.inference_mode():
        return torch.randn(*shape)


def run_x(runner: NeuronRunner, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return runner.run("decode", {"x": x})


def eager(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


def fast_calls(runner: NeuronRunner) -> int:
    return sum(f.calls for fs in runner.fast_path.graphs.values() for f in fs)


#: modules a served call must not enter: resolving a variant (scope, flags, keys), the cache, records, manifests
_RESOLUTION = ("cache", "cache_key", "scope", "flags", "manifest", "seams/records", "seams/trace_memo")


def _neuron_args_calls(fn) -> list[tuple[str, str]]:
    """The neuron_args Python functions ``fn()`` calls, in order (module path inside the package, name)."""
    return [(f.split("neuron_args", 1)[1].lstrip("/."), name) for f, name in python_calls(fn) if "neuron_args" in f]


def test_a_served_call_does_the_same_work_every_call_and_no_resolution(scaled):
    """The fast path replays the variant: each call the same neuron_args steps, none resolving the scope's variant
    (``CompiledGraph.__call__``), keying, reading the cache or writing records and manifests."""
    x = inp(2, 8)
    with scaled.serve():
        run_x(scaled, x)
        calls = [_neuron_args_calls(lambda: run_x(scaled, x)) for _ in range(3)]
    assert fast_calls(scaled) == 4
    assert calls[0] == calls[1] == calls[2], calls
    names = {name for _, name in calls[0]}
    assert {"NeuronRunner.run", "FastPath.call", "FastGraph._dispatch"} <= names, names
    assert "CompiledGraph.__call__" not in names
    entered = sorted({f for f, _ in calls[0] if f.startswith(_RESOLUTION)})
    assert entered == [], entered


def test_a_failed_guard_takes_the_guarded_path_never_a_stale_graph(scaled):
    x = inp(2, 8)
    first = scaled.fast_path.graphs["decode"][0]
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert first.calls == 1
    scaled.model.scale = 3.0  # Dynamo guards on it; skip_guard_eval_unsafe would serve the 2.0 graph
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert first.calls == 1, "the changed attribute failed the guards: guarded path"
    second, kept = scaled.fast_path.graphs["decode"]
    assert kept is first and second is not first, "the recompiled graph is learned next to the old one"
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert second.calls == 1
    scaled.model.scale = 2.0
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert first.calls == 2, "back to 2.0: the first fast graph's guards pass again"


def test_parameters_are_read_afresh_and_seen_when_updated_in_place(scaled):
    x = inp(2, 8)
    run_x(scaled, x)
    with torch.no_grad():
        scaled.model.fc.weight.mul_(-1.5)  # the aliased buffer sees it
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    scaled.model.fc.weight.data = torch.randn(4, 8)  # new storage
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    scaled.model.fc = torch.nn.Linear(8, 4)  # a new module object
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))


def test_weights_passed_again_reuse_their_buffers_and_every_change_is_seen(scaled):
    """After a few served calls the executable checks the weights in bulk and reuses their buffers; a weight
    written in place, given new storage or replaced by a new module between calls still gives eager's result."""
    from neuron_args import executables

    x = inp(2, 8)
    fast = scaled.fast_path.graphs["decode"][0]
    for _ in range(3):
        torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    (exe,) = [e for e in executables._loaded.values() if any(t is scaled.model.fc.weight for t in
                                                               getattr(e._stable, "tensors", ()))]
    weight, bias = scaled.model.fc.weight, scaled.model.fc.bias
    assert {id(t) for t in exe._stable.tensors} >= {id(weight), id(bias)}
    for step in range(6):
        x = inp(2, 8)  # a new input each call, the same weights
        with torch.no_grad():
            bias.add_(0.25)  # written in place: the held buffer aliases it
        torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
        if step == 2:
            weight.data = torch.randn(4, 8)  # the same parameter object, new storage
        if step == 4:
            scaled.model.fc = torch.nn.Linear(8, 4)  # new parameter objects
            weight, bias = scaled.model.fc.weight, scaled.model.fc.bias
    assert fast.calls == 9, "every call took the fast path"


def test_other_shapes_layouts_hooks_and_resets_fall_back(scaled, monkeypatch):
    x = inp(2, 8)
    run_x(scaled, x)
    fast = scaled.fast_path.graphs["decode"][0]
    # a transposed input: same shape, other strides -> Dynamo's guards fail, the guarded path recompiles
    xt = inp(8, 2).t()
    torch.testing.assert_close(run_x(scaled, xt), eager(scaled.model, xt))
    # a forward hook on the entry runs only on the guarded path: the fast path steps aside
    handle = scaled.model.register_forward_hook(lambda mod, args, out: out + 100.0)
    calls = fast.calls
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert fast.calls == calls
    handle.remove()
    # an unwarmed shape under serve is the guarded path's cache miss, not a fast-path error
    with scaled.serve(), pytest.raises(CacheMissError):
        run_x(scaled, inp(3, 8))
    # a stance other than the default (force_eager here) is Dynamo's to apply
    calls = fast.calls
    with torch.compiler.set_stance("force_eager"):
        torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))
    assert fast.calls == calls
    # torch._dynamo.reset() drops the cache entry: the fast graph is no longer valid
    run_x(scaled, x)
    assert fast.valid()
    torch._dynamo.reset()
    assert not fast.valid()
    assert scaled.fast_path.call("decode", {"x": x}) is MISS
    torch.testing.assert_close(run_x(scaled, x), eager(scaled.model, x))


def test_the_environment_switch_turns_it_off(scaled_cache, monkeypatch):
    monkeypatch.setenv(ENV, "0")
    assert FastPath().enabled is False
    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, compiler="local", cache_dir=scaled_cache)
    runner.warmup(emit=False)
    x = inp(2, 8)
    torch.testing.assert_close(run_x(runner, x), eager(runner.model, x))
    assert runner.fast_path.graphs == {}


class Refusable(torch.nn.Module):
    """Calls the fast path must not replay: each kind is its own graph."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.fc = torch.nn.Linear(8, 4)
        self.calls = 0
        self.extra = torch.ones(4)  # a plain tensor attribute (not a parameter or buffer)

    def forward(self, x: torch.Tensor) -> object:
        y = self.fc(x)
        if self.kind == "counter":
            self.calls += 1
        elif self.kind == "side effect":
            self.last_batch = 2  # written, never read: nothing to guard on, a side effect to replay
        elif self.kind == "graph break":
            torch._dynamo.graph_break()
            y = y * 2
        elif self.kind == "dict":
            return {"y": y}
        elif self.kind == "input":
            return x
        elif self.kind == "attribute":
            return y + self.extra
        elif self.kind == "tuple":
            return y, y * 2
        return y

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8)}})]


@pytest.mark.parametrize("kind, reason", [
    ("counter", "no Dynamo cache entry"),  # guarded on the value it changed: refused for that too
    ("graph break", "ran 2 compiled graphs"),
    ("input", "aliases (is_input)"),
])
def test_calls_that_cannot_be_replayed_exactly_keep_the_guarded_path(kind, reason, tmp_path_factory):
    torch._dynamo.reset()
    model = Refusable(kind)
    runner = NeuronRunner(model, compiler_args=BASE, backend=CAPTURE_SEAM, fullgraph=kind != "graph break",
                          cache_dir=tmp_path_factory.mktemp("fastpath-refused"))
    runner.warmup(emit=False)
    ((_, why),) = runner.fast_path.refused.items()
    assert reason in why
    x = inp(2, 8)
    for _ in range(3):
        got, want = run_x(runner, x), eager(Refusable(kind), x)
        if kind == "dict":
            got, want = got["y"], want["y"]
        torch.testing.assert_close(got, want)
    assert runner.fast_path.graphs == {}
    if kind == "counter":
        assert model.calls == 4, "warmup + three calls, each replayed by Dynamo's bytecode"


def test_side_effects_result_structures_and_plain_tensor_attributes_run_as_dynamo_runs_them(tmp_path_factory):
    """Dynamo's own code for the frame runs on the fast path: an attribute written outside the graph is written,
    a dict result is built, a plain tensor attribute of the module is read afresh (guarded by Dynamo)."""
    x = inp(2, 8)
    for kind in ("side effect", "dict", "attribute"):
        model = Refusable(kind)
        runner, fast = learned(model, tmp_path_factory.mktemp("fp-dynamo-code"))
        for step in range(3):
            model.__dict__.pop("last_batch", None)
            with torch.no_grad():
                model.extra.add_(1.0)  # in place: the next call reads the new values
            got = run_x(runner, x)
            if kind == "side effect":
                assert model.last_batch == 2, "the fast call made the write the guarded call makes"
            want = eager(model, x)
            if kind == "dict":
                assert type(got) is dict and set(got) == {"y"}
                got, want = got["y"], want["y"]
            torch.testing.assert_close(got, want)
        assert fast.calls == 3, kind


def test_tuple_outputs_replay_in_their_structure(tmp_path_factory):
    torch._dynamo.reset()
    runner = NeuronRunner(Refusable("tuple"), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-tuple"))
    runner.warmup(emit=False)
    x = inp(2, 8)
    got = run_x(runner, x)
    assert type(got) is tuple and len(got) == 2 and fast_calls(runner) == 1
    want = eager(Refusable("tuple"), x)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


class WithInt(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, n: int = 2, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = self.fc(x) * n
        return y if bias is None else y + bias

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8), "n": 2}})]


def test_python_values_and_defaults_are_guarded_too(tmp_path_factory):
    torch._dynamo.reset()
    model = WithInt()
    runner = NeuronRunner(model, compiler_args=BASE, backend=CAPTURE_SEAM, cache_dir=tmp_path_factory.mktemp("fp-int"))
    runner.warmup(emit=False)
    (fast,) = runner.fast_path.graphs["decode"]
    x, bias = inp(2, 8), inp(4)
    with torch.inference_mode():
        for n, b in ((2, None), (3, None), (2, None), (2, bias)):
            kwargs = {"x": x, "n": n} if b is None else {"x": x, "n": n, "bias": b}
            torch.testing.assert_close(runner.run("decode", kwargs), model(**kwargs))
    assert fast.calls == 2, "n=2 twice through the fast path; n=3 and the bias call were guarded"
    assert len(runner.fast_path.graphs["decode"]) == 3, "one fast graph per Dynamo cache entry"


def test_threads_serving_one_runner_get_their_own_results(scaled):
    """Recording in one thread does not capture (or block) another thread's calls."""
    import threading

    inputs = [inp(2, 8) for _ in range(8)]
    want = [eager(scaled.model, x) for x in inputs]
    got: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        for _ in range(20):
            got[i] = run_x(scaled, inputs[i])

    scaled.fast_path.graphs.clear()  # the first calls record while the others run
    scaled.fast_path.refused.clear()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i], w)
    assert scaled.fast_path.refused == {} and len(scaled.fast_path.graphs["decode"]) >= 1


class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("cache", torch.zeros(2, 4))

    def forward(self, x: torch.Tensor, extras: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.add_(extras[1])  # an in-place buffer update: copied back after each call
        return self.fc(x) + extras[0], self.cache * 1

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8),
                                                          "extras": [torch.ones(4), torch.ones(2, 4)]}})]


def test_tensors_inside_list_arguments_and_buffer_updates(tmp_path_factory):
    torch._dynamo.reset()
    model = Nested()
    runner = NeuronRunner(model, compiler_args=BASE, compiler="local", cache_dir=tmp_path_factory.mktemp("fp-nested"))
    runner.warmup(emit=False)
    (fast,) = runner.fast_path.graphs["decode"]
    reference = copy.deepcopy(model)
    for _ in range(5):
        x, extras = inp(2, 8), [inp(4), inp(2, 4)]
        got = runner.run("decode", {"x": x, "extras": extras})
        with torch.inference_mode():
            want = reference(x, extras)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
        torch.testing.assert_close(model.cache, reference.cache)
    assert fast.calls == 5 and fast.mutated


class StarKwargs(torch.nn.Module):
    """A vLLM-style ``forward(self, x, positions, **kwargs)`` reading one extra keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, *args: object, **kwargs: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y + kwargs["shift"] if "shift" in kwargs else y

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8), "shift": torch.ones(4)}})]


def learned(model: torch.nn.Module, cache_dir) -> tuple[NeuronRunner, FastGraph]:
    """A runner of ``model`` (capture seam) warmed up, and the one fast graph it learned."""
    torch._dynamo.reset()
    runner = NeuronRunner(model, compiler_args=BASE, backend=CAPTURE_SEAM, cache_dir=cache_dir)
    runner.warmup(emit=False)
    assert runner.fast_path.refused == {}
    (fast,) = runner.fast_path.graphs["decode"]
    return runner, fast


def test_star_args_and_kwargs_frames_are_guarded_as_python_builds_them(tmp_path_factory):
    model = StarKwargs()
    runner, fast = learned(model, tmp_path_factory.mktemp("fp-star"))
    x, shift = inp(2, 8), inp(4)
    for kwargs in ({"x": x, "shift": shift}, {"shift": shift, "x": x}, {"x": x}):
        with torch.inference_mode():
            torch.testing.assert_close(runner.run("decode", kwargs), model(**kwargs))
    assert fast.calls == 2, "both orders of the same keywords replay; without shift is another graph"


class Accumulate(torch.nn.Module):
    """``total += x``, returning ``x * 2``: the graph writes one of its keyword arguments in place."""

    def forward(self, x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return x * 2

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 4), "total": torch.zeros(2, 4)}})]


def test_tensors_made_outside_inference_mode_are_written_in_place_without_a_new_trace(tmp_path_factory):
    """Warmup traced inference tensors; ordinary ones are served through inference tensors on their memory: the
    write lands in the caller's tensor, whose version moves as an in-place write moves it (the read one's does not)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = Accumulate()
    runner, fast = learned(model, tmp_path_factory.mktemp("fp-acc"))
    assert fast.mutated_kwargs == {"total"}
    code = type(model.__dict__["forward"]).__call__.__code__
    traced = len(_debug_get_cache_entry_list(code))
    x, total = torch.randn(2, 4), torch.zeros(2, 4)
    assert not (x.is_inference() or total.is_inference())
    for step in range(1, 4):
        torch.testing.assert_close(runner.run("decode", {"x": x, "total": total}), x * 2)
        torch.testing.assert_close(total, x * step)
        assert (total._version, x._version) == (step, 0)
    assert fast.calls == 3 and runner.fast_path.graphs["decode"] == [fast]
    assert len(_debug_get_cache_entry_list(code)) == traced, "no graph was traced again"


class _Flags:
    def __init__(self) -> None:
        self.mode: str | None = None


FLAGS = _Flags()
LAST_MODE = "idle"


class GlobalWrites(torch.nn.Module):
    """Sets module-global state to constants, as transformers' output capturing resets its collector."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global LAST_MODE
        FLAGS.mode = "served"
        LAST_MODE = "decode"
        return self.fc(x)

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8)}})]


def test_constant_writes_to_module_globals_are_replayed(tmp_path_factory):
    global LAST_MODE
    runner, fast = learned(GlobalWrites(), tmp_path_factory.mktemp("fp-glob"))
    reference = GlobalWrites()
    for _ in range(2):
        x = inp(2, 8)
        want = eager(reference, x)
        FLAGS.mode, LAST_MODE = None, "idle"
        got = run_x(runner, x)
        assert (FLAGS.mode, LAST_MODE) == ("served", "decode"), "the fast call made the writes the guarded one makes"
        torch.testing.assert_close(got, want)
    assert fast.calls == 2
