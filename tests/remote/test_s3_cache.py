"""A compile cache on S3-compatible storage (``cache_dir="s3://bucket/prefix"``), against a real S3 server:
moto's server mode on 127.0.0.1 (HTTP, in a thread of this process), never a mock of the client.

Two local copies of one bucket stand for two hosts (``NEURON_ARGS_REMOTE_CACHE_COPY`` differs)."""
from __future__ import annotations

import json
import logging
import socket

import pytest

from neuron_args import remote_cache
from neuron_args.activity import ACTIVITY
from neuron_args.cache import CACHE_DIR_ENV, STATS, CompileCache, cache_root, new_metadata
from neuron_args.remote_cache import COPY_ENV, TIMEOUT_ENV, RemoteCacheError
from tests.remote.s3_helpers import BUCKET, builder, free_port, host, make_key, remote_objects


def test_url_maps_to_a_bound_local_copy(monkeypatch, tmp_path):
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "copies"))
    root = cache_root("s3://neuron-cache/team/nightly")
    assert root == (tmp_path / "copies" / "neuron-cache" / "team" / "nightly").resolve()
    assert remote_cache.remote_url(root) == "s3://neuron-cache/team/nightly"
    assert CompileCache("s3://neuron-cache/team/nightly").root == root
    monkeypatch.setenv(CACHE_DIR_ENV, "s3://neuron-cache/team/nightly")
    assert cache_root() == root
    import torch

    from neuron_args.runner import NeuronRunner

    assert NeuronRunner(torch.nn.Linear(2, 2), graphs=[], cache_dir="s3://neuron-cache/team/nightly").cache_dir == root
    for bad in ("s3://UPPER/x", "s3://ok-bucket/../etc", "s3://a", "s3://ok-bucket\n/x"):
        with pytest.raises(remote_cache.OptionsError, match="cache_dir"):
            cache_root(bad)


def test_host_b_loads_what_host_a_built(monkeypatch, tmp_path, client):
    url = f"s3://{BUCKET}/share"
    key, calls = make_key(), []
    a = host(monkeypatch, tmp_path, "a", url)
    entry_a, hit = a.get_or_build(key, builder(key, calls))
    assert hit is False and calls == [a.root]
    objects = remote_objects(client, f"share/{key.key}/")
    assert f"share/{key.key}/COMPLETE" in objects and len(objects) == 4  # the marker, the hlo, the neff, the metadata
    marker = json.loads(client.get_object(Bucket=BUCKET, Key=f"share/{key.key}/COMPLETE")["Body"].read())
    assert marker["key"] == key.key and set(marker["files"]) == {"graph.hlo", f"graph_{key}.neff", "metadata.json"}

    b = host(monkeypatch, tmp_path, "b", url)
    assert b.root != a.root and not b.entry(key).path.exists()
    compiles = STATS.compiles
    entry_b, hit = b.get_or_build(key, builder(key, calls))
    assert hit is True and calls == [a.root] and STATS.compiles == compiles  # host B compiled nothing
    assert entry_b.status == "complete" and entry_b.problem() is None
    assert entry_b.executable_path.read_bytes() == entry_a.executable_path.read_bytes()
    assert not (b.root / remote_cache.INCOMING_DIR).exists() or not any((b.root / remote_cache.INCOMING_DIR).iterdir())
    assert [e.key for e in b.entries()] == [key.key]


def test_second_publisher_keeps_the_first_marker(monkeypatch, tmp_path, client):
    url = f"s3://{BUCKET}/race"
    key = make_key("HloModule race")
    a, b = host(monkeypatch, tmp_path, "a", url), host(monkeypatch, tmp_path, "b", url)
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "a"))
    for cache, exe in ((a, b"bytes of A"), (b, b"bytes of B")):  # both built before either looked remotely
        entry = cache.entry(key)
        entry.reset()
        builder(key, [], exe)(entry)
        entry.path.joinpath("COMPLETE").write_text("now")
    assert remote_cache.publish(a.entry(key), "decode") is True
    assert remote_cache.publish(b.entry(key), "decode") is False  # If-None-Match: the marker was there
    marker = json.loads(client.get_object(Bucket=BUCKET, Key=f"race/{key.key}/COMPLETE")["Body"].read())
    got = client.get_object(Bucket=BUCKET, Key=f"race/{key.key}/{marker['folder']}/graph_{key}.neff")["Body"].read()
    assert got == b"bytes of A"


def test_corrupt_remote_executable_is_rebuilt_not_served(monkeypatch, tmp_path, client, caplog):
    url = f"s3://{BUCKET}/corrupt"
    key, calls = make_key("HloModule corrupt"), []
    a = host(monkeypatch, tmp_path, "a", url)
    a.get_or_build(key, builder(key, calls))
    marker = json.loads(client.get_object(Bucket=BUCKET, Key=f"corrupt/{key.key}/COMPLETE")["Body"].read())
    exe_key = f"corrupt/{key.key}/{marker['folder']}/graph_{key}.neff"
    client.put_object(Bucket=BUCKET, Key=exe_key, Body=b"neff bytEs")  # same size, other bytes

    b = host(monkeypatch, tmp_path, "b", url)
    with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
        entry, hit = b.get_or_build(key, builder(key, calls))
    assert hit is False and calls == [a.root, b.root]  # rebuilt on host B
    assert entry.executable_path.read_bytes() == b"neff bytes"
    assert f"remote cache entry {url}/{key.key}/ (a graph with no graph type) is not loaded" in caplog.text and "sha256" in caplog.text
    # the rebuild replaced the remote entry: host C loads it without compiling
    c = host(monkeypatch, tmp_path, "c", url)
    _, hit = c.get_or_build(key, builder(key, calls))
    assert hit is True and len(calls) == 2


def test_missing_marker_is_a_miss(monkeypatch, tmp_path, client):
    url = f"s3://{BUCKET}/partial"
    key, calls = make_key("HloModule partial"), []
    a = host(monkeypatch, tmp_path, "a", url)
    a.get_or_build(key, builder(key, calls))
    client.delete_object(Bucket=BUCKET, Key=f"partial/{key.key}/COMPLETE")  # an upload that died before its marker
    assert remote_cache.store_for(a.root).markers() == []
    b = host(monkeypatch, tmp_path, "b", url)
    _, hit = b.get_or_build(key, builder(key, calls))
    assert hit is False and calls == [a.root, b.root]


def test_endpoint_down_builds_locally_with_one_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    url = f"s3://{BUCKET}/down"
    cache, calls = host(monkeypatch, tmp_path, "a", url), []
    keys = [make_key("HloModule down"), make_key("HloModule down 2")]
    with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
        for key in keys:
            _, hit = cache.get_or_build(key, builder(key, calls), graph_type="decode")
            assert hit is False
    assert len(calls) == 2 and all(cache.entry(k).status == "complete" for k in keys)
    warned = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warned) == 1 and keys[0].key in warned[0] and "127.0.0.1" in warned[0] and "'decode'" in warned[0] \
        and "local copy only" in warned[0]


def test_refused_credentials_are_a_clear_error(monkeypatch, tmp_path):
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks credentials now
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
    cache, calls, key = host(monkeypatch, tmp_path, "a", f"s3://{BUCKET}/auth"), [], make_key("HloModule auth")
    with pytest.raises(RemoteCacheError) as info:
        cache.get_or_build(key, builder(key, calls), graph_type="decode")
    text = str(info.value)
    assert key.key in text and "'decode'" in text and "127.0.0.1" in text and "InvalidAccessKeyId" in text
    assert "fix:" in text and calls == [] and not cache.entry(key).path.exists()


@pytest.mark.slow  # compiles a real graph (the local compiler's warm worker processes)
def test_torch_compile_model_on_two_hosts(monkeypatch, tmp_path):
    import torch

    from tests.models import make_mlp, mlp_inputs

    url = f"s3://{BUCKET}/torch"
    model, (x,) = make_mlp(), mlp_inputs()
    with torch.inference_mode():
        want = model(x)
    outs = []
    for name in ("a", "b"):  # host A compiles and publishes; host B loads it
        monkeypatch.setenv(COPY_ENV, str(tmp_path / name))
        torch._dynamo.reset()
        ACTIVITY.reset()
        compiled = torch.compile(model, backend="neuron_libtorch", dynamic=False, options={
            "cache_dir": url, "compiler_args": ["--auto-cast=none", "-O1"], "target": "trn2", "compiler": "local"})
        with torch.inference_mode():
            outs.append(compiled(x))
        outs.append((STATS.compiles, STATS.hits))
    (out_a, (compiles_a, _)), (out_b, (compiles_b, hits_b)) = (outs[0], outs[1]), (outs[2], outs[3])
    assert compiles_a == 1 and compiles_b == 0 and hits_b == 1
    torch.testing.assert_close(out_a, want)
    torch.testing.assert_close(out_b, want)
    local_b = CompileCache(url)
    assert local_b.root == (tmp_path / "b" / BUCKET / "torch").resolve()
    assert [e.status for e in local_b.entries()] == ["complete"]
    # host C captures for a deferred build: the remote entry is copied, nothing is captured to compile later
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "c"))
    torch._dynamo.reset()
    ACTIVITY.reset()
    captured = torch.compile(model, backend="neuron_libtorch_graph_capture", dynamic=False, options={
        "cache_dir": url, "compiler_args": ["--auto-cast=none", "-O1"], "target": "trn2", "compiler": "local"})
    with torch.inference_mode():
        captured(x)
    assert STATS.captures == 0 and [e.status for e in CompileCache(url).entries()] == ["complete"]


def test_manifest_records_the_remote_location(monkeypatch, tmp_path, clean_ledger, capsys):
    import shutil

    from neuron_args.cli import main
    from neuron_args.manifest.emit import emit_manifest
    from neuron_args.manifest.ledger import record_graph
    from neuron_args.manifest.schema import validate_manifest

    url = f"s3://{BUCKET}/manifest"
    key, calls = make_key("HloModule manifest"), []
    cache = host(monkeypatch, tmp_path, "a", url)
    cache.get_or_build(key, builder(key, calls))
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "manifests"))
    record_graph(key=key.key, input_shapes=["4,"], compiler_flags="-O1")
    path = emit_manifest(cache_dir=url)
    doc = json.loads(path.read_text())
    assert doc["config"]["neuron_config"] == {"cache_dir": str(cache.root), "remote_cache": url}
    assert doc["graphs"][0]["neff_path"] == f"{key}/graph_{key}.neff"
    assert validate_manifest(doc) == []
    # on another host the recorded folder is absent: the manifest is checked against its copy of the remote
    shutil.rmtree(cache.root)
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "b"))
    assert main(["manifest", "validate", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cache_dir"] == str((tmp_path / "b" / BUCKET / "manifest").resolve()) and out["note"] is None
    assert (tmp_path / "b" / BUCKET / "manifest" / key.key / f"graph_{key}.neff").is_file()


def test_plugin_option_takes_an_s3_url(monkeypatch, tmp_path, pytester):
    from pytest_neuron_args.options import NeuronSettings

    monkeypatch.setenv(COPY_ENV, str(tmp_path / "copies"))
    config = pytester.parseconfig(f"--neuron-cache-dir=s3://{BUCKET}/plugin", "--neuron-compiler=local")
    settings = NeuronSettings.from_config(config)
    assert settings.cache_dir == (tmp_path / "copies" / BUCKET / "plugin").resolve()
    assert remote_cache.remote_url(settings.cache_dir) == f"s3://{BUCKET}/plugin"


def test_a_silent_endpoint_times_out_and_builds_locally(monkeypatch, tmp_path, caplog):
    """An endpoint that accepts connections and never answers (a stalled network): bounded by the read timeout
    and AWS_MAX_ATTEMPTS, then the same loud local-only fallback, never a hang."""
    import threading

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []

    def hold() -> None:
        while True:
            try:
                held.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=hold, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    cache, calls, key = host(monkeypatch, tmp_path, "a", f"s3://{BUCKET}/slow"), [], make_key("HloModule slow")
    try:
        with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
            _, hit = cache.get_or_build(key, builder(key, calls), graph_type="decode")
    finally:
        silent.close()
        for conn in held:
            conn.close()
    assert hit is False and calls == [cache.root] and cache.entry(key).status == "complete"
    assert len(held) == 2  # AWS_MAX_ATTEMPTS attempts, each ended by the read timeout
    assert "unreachable" in caplog.text and "ReadTimeout" in caplog.text and TIMEOUT_ENV in caplog.text


def test_parallel_compile_copies_a_pending_entry_another_host_built(monkeypatch, tmp_path):
    from neuron_args.deferred.parallel_compile import parallel_compile

    url = f"s3://{BUCKET}/deferred"
    key, calls = make_key("HloModule deferred"), []
    host(monkeypatch, tmp_path, "a", url).get_or_build(key, builder(key, calls))
    b = host(monkeypatch, tmp_path, "b", url)
    pending = b.entry(key)  # host B captured the same graph for a deferred build
    pending.reset()
    pending.hlo_path.write_bytes(b"hlo")
    pending.write_metadata(new_metadata(key, seam="neuron_libtorch_graph_capture", graph_type="decode",
                                        compiler_args=["-O1"], target="trn2", status="pending"))
    assert pending.status == "pending"
    report = parallel_compile(url, quiet=True, workers=1)
    assert [(g.key, g.status) for g in report.graphs] == [(key.key, "already-complete")]
    assert pending.status == "complete" and pending.executable_path.read_bytes() == b"neff bytes"


@pytest.mark.slow  # two pytest sessions that compile a model (in-process)
def test_pytest_sessions_on_two_hosts_share_the_bucket(monkeypatch, tmp_path, neuron_project):
    """The plugin with --neuron-cache-dir=s3://...: host A's session compiles, host B's loads everything."""
    neuron_project.makepyfile(test_serve="""
        import torch

        def test_serve(neuron_served):
            neuron_served.run("decode", {"x": torch.ones(1, 8)})
    """)
    outs = []
    for name in ("a", "b"):
        monkeypatch.setenv(COPY_ENV, str(tmp_path / name))
        result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir=s3://{BUCKET}/plugin-e2e")
        result.assert_outcomes(passed=1)
        outs.append(result.stdout.str())
    assert "2 graphs: 2 compiled, 0 loaded" in outs[0], outs[0]
    assert "2 graphs: 0 compiled, 2 loaded" in outs[1], outs[1]
    assert f"session cache {(tmp_path / 'b' / BUCKET / 'plugin-e2e').resolve()}" in outs[1]


def test_signing_host_does_not_load_an_unsigned_remote_entry(monkeypatch, tmp_path, caplog):
    url = f"s3://{BUCKET}/signed"
    key, calls = make_key("HloModule signed"), []
    host(monkeypatch, tmp_path, "a", url).get_or_build(key, builder(key, calls))  # written without a key
    monkeypatch.setenv("NEURON_ARGS_CACHE_SIGNING_KEY", "team secret")
    b = host(monkeypatch, tmp_path, "b", url)
    with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
        entry, hit = b.get_or_build(key, builder(key, calls))
    assert hit is False and len(calls) == 2 and "not signed" in caplog.text
    assert json.loads(entry.metadata_path.read_text())["signature"].startswith("hmac-sha256:")
