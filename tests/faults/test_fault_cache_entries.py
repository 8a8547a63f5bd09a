"""Cache entries a later session finds damaged or misplaced: detected, named (key), rebuilt; never served wrong."""
from __future__ import annotations

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.cache import CompileCache
from tests.security.security_helpers import executable_fields
from tests.test_cache import builder, make_key


def _built(cache: CompileCache, key, payload: bytes):
    def build(entry):
        builder(key)(entry)
        entry.executable_path.write_bytes(payload)
        entry.update_metadata(**executable_fields(entry.executable_path))
    entry, _ = cache.get_or_build(key, build)
    return entry


def test_entries_whose_folders_were_swapped_are_rebuilt_not_served(tmp_path):
    """Two entries of one graph and inputs, -O1 and -O3, whose folders were swapped (a sync tool, a hand `mv`) with
    their executables renamed to match: each executable's size and sha256 agree with the metadata beside it, so the
    -O1 executable was served for the -O3 key (with other input shapes the call failed blaming the user's inputs)."""
    ACTIVITY.reset()
    cache = CompileCache(tmp_path)
    o1, o3 = make_key(args=("-O1",)), make_key(args=("-O3",))
    a, b = _built(cache, o1, b"exe -O1"), _built(cache, o3, b"exe -O3")
    a.path.rename(tmp_path / "swap")
    b.path.rename(a.path)
    (tmp_path / "swap").rename(b.path)
    (a.path / b.executable_path.name).rename(a.executable_path)
    (b.path / a.executable_path.name).rename(b.executable_path)
    ACTIVITY.verified.clear()  # a later session
    assert a.problem() == (f"metadata.json is entry {o3.key}'s, not this one's (the entry's files were moved or copied "
                           "from another entry)")
    rebuilt, hit = cache.get_or_build(o1, builder(o1))
    assert hit is False and rebuilt.executable_path.read_bytes() == b"exe"  # built again, not the -O3 executable
    assert o1.key in ACTIVITY.corrupt and [p.name[:32] for p in (tmp_path / ".corrupt").iterdir()] == [o1.key]


@pytest.mark.slow
def test_another_pending_entry_that_does_not_compile_fails_no_warmup_of_this_model(tmp_path, caplog):
    """The parallel flow also builds every other pending entry of the cache (as parallel_compile's scan would). One
    left by an earlier interrupted session, or another project's on a shared nightly cache, whose graph.hlo is torn,
    failed this model's warmup with a ParallelCompileError about a graph it does not have."""
    import torch

    from neuron_args.graphs import GraphSpec
    from neuron_args.runner import NeuronRunner
    from tests.test_stream import capture

    (foreign,) = capture(tmp_path, (3,))
    CompileCache(tmp_path).entry(foreign).hlo_path.write_bytes(b"half an HloModuleProto")
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4)
    graphs = [GraphSpec("decode", model, {"b1": lambda: {"input": torch.ones(1, 8)}})]
    NeuronRunner(model, graphs=graphs, compiler="local", cache_dir=tmp_path).warmup(emit=False)  # the record: no child
    torch._dynamo.reset()
    report = NeuronRunner(model, graphs=graphs, compiler="local", cache_dir=tmp_path).warmup(flow="parallel", emit=False)
    assert [(g.graph_type, g.how) for g in report.graphs] == [("decode", "loaded")]
    assert CompileCache(tmp_path).entry(foreign).status == "pending"  # left for a rerun, as parallel_compile leaves it
    assert f"pending entry {foreign} (graph type None) of the cache, not one of this warmup's graphs, did not " \
           "compile" in caplog.text


def test_a_torn_graph_hlo_is_named_as_such_not_blamed_on_the_graph(tmp_path):
    """A pending entry whose graph.hlo was cut short: the compile failed saying 'fix the graph or its compiler
    arguments', which cannot help."""
    from neuron_args.deferred import ParallelCompileError, parallel_compile
    from tests.test_stream import capture

    (key,) = capture(tmp_path, (3,))
    hlo = CompileCache(tmp_path).entry(key).hlo_path
    hlo.write_bytes(hlo.read_bytes()[:40])
    with pytest.raises(ParallelCompileError) as err:
        parallel_compile(tmp_path, quiet=True)
    assert f"fix: {hlo} is damaged (a capture cut short): capture it again (rerun the warmup or parallel_trace), " \
           "or remove that entry's folder" in str(err.value)
