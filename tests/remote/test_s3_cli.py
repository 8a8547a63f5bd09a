"""The ``cache`` commands on an ``s3://`` cache against the moto server: ``ls`` lists from the markers and
downloads nothing, ``verify`` downloads and checks, ``explain`` downloads only the entries it names, and a
remote that cannot be used exits 3."""
from __future__ import annotations

import json

import pytest

from neuron_args.cache import new_metadata
from neuron_args.cli import EXIT_REMOTE, main
from neuron_args.remote_cache import BINDING_FILE, COPY_ENV, TIMEOUT_ENV
from tests.remote.s3_helpers import BUCKET, builder, free_port, host, make_key


@pytest.fixture
def published(monkeypatch, tmp_path, client):
    """Host A built two entries into ``s3://neuron-cache/cli-<test>``; the second one's remote executable is
    then damaged (same listing, other bytes)."""
    url = f"s3://{BUCKET}/cli-{tmp_path.name[-24:]}"
    good, bad, calls = make_key(f"HloModule good {tmp_path.name}"), make_key(f"HloModule bad {tmp_path.name}"), []
    a = host(monkeypatch, tmp_path, "a", url)
    for key in (good, bad):
        a.get_or_build(key, builder(key, calls))
    prefix = url[len(f"s3://{BUCKET}/"):]
    marker = json.loads(client.get_object(Bucket=BUCKET, Key=f"{prefix}/{bad.key}/COMPLETE")["Body"].read())
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{bad.key}/{marker['folder']}/graph_{bad}.neff", Body=b"short")
    sizes = {k.key: a.entry(k).size_bytes() - len(a.entry(k).marker_path.read_bytes()) for k in (good, bad)}
    return url, good, bad, sizes


def test_ls_lists_the_markers_and_downloads_nothing(monkeypatch, tmp_path, capsys, published):
    url, good, bad, sizes = published
    ops = tmp_path / "ops"
    monkeypatch.setenv(COPY_ENV, str(ops))  # a third host that built nothing
    assert main(["cache", "ls", "--json", url]) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = {e["key"]: e for e in listed["entries"]}
    assert set(rows) == {good.key, bad.key} and listed["remote_cache"] == url
    for key in (good, bad):
        row = rows[key.key]
        assert (row["graph_type"], row["compiler_args"], row["opt_level"], row["status"]) == ("decode", ["-O1"], "-O1", "complete")
        assert row["size"] == sizes[key.key] and row["remote"] is True and row["local_status"] is None
        assert isinstance(row["created"], str) and row["created"][:2] == "20"
    assert listed["counts"] == {"complete": 2}
    copy = ops / BUCKET / url.rsplit("/", 1)[1]
    assert sorted(p.name for p in copy.iterdir()) == [BINDING_FILE]  # no entry, no lock, no incoming folder

    assert main(["cache", "ls", url]) == 0
    out = capsys.readouterr().out
    assert "listed from its markers (nothing downloaded)" in out and "WHERE" in out and "CREATED" in out
    assert "2 remote entries (2 complete)" in out and "0 also in the local copy; 0 only in the local copy" in out
    assert sorted(p.name for p in copy.iterdir()) == [BINDING_FILE]


def test_ls_says_which_entries_the_local_copy_holds(monkeypatch, tmp_path, capsys, published):
    url, good, bad, _ = published
    local_only = make_key(f"HloModule local only {tmp_path.name}")
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "a"))  # host A: both built here, plus one its upload never reached
    a = host(monkeypatch, tmp_path, "a", url)
    entry = a.entry(local_only)
    entry.reset()
    builder(local_only, [])(entry)
    entry.marker_path.write_text("now")  # complete here, never published
    assert main(["cache", "ls", "--json", url]) == 0
    listed = {e["key"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    assert listed[local_only.key]["compiler_args"] == ["-O1"] and listed[local_only.key]["created"][:2] == "20"
    rows = {k: (e["remote"], e["local_status"], e["status"]) for k, e in listed.items()}
    assert rows == {good.key: (True, "complete", "complete"), bad.key: (True, "complete", "complete"),
                    local_only.key: (False, "complete", "complete")}
    assert main(["cache", "ls", url]) == 0
    out = capsys.readouterr().out
    assert out.count("remote+local") == 2 and out.count("local only") == 1
    assert "2 also in the local copy; 1 only in the local copy" in out


def test_verify_downloads_and_checks_every_entry(monkeypatch, tmp_path, capsys, published):
    url, good, bad, _ = published
    monkeypatch.setenv(COPY_ENV, str(tmp_path / "ops"))
    assert main(["cache", "verify", url]) == 1  # the damaged remote entry fails verify
    out, err = capsys.readouterr()
    assert f"remote cache {url}: 2 complete entries listed, 1 downloaded to the local copy now, each checked on " \
           "download (size and sha256 from its marker, then the cache's own check), 1 not loaded" in err
    assert f"corrupt remote entry {url}/{bad.key}/" in out and "1 complete" in out
    assert main(["cache", "verify", "--json", url]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["remote_listed"], doc["remote_downloaded"], doc["checked"]) == (2, 0, 1)  # downloaded by the run above
    assert doc["remote_not_loaded"] == [{"key": bad.key, "remote": f"{url}/{bad.key}/"}] and doc["ok"] is False


def test_explain_downloads_only_the_entries_it_names(monkeypatch, tmp_path, capsys, published, client):
    url, good, bad, _ = published
    third = make_key(f"HloModule third {tmp_path.name}")
    host(monkeypatch, tmp_path, "a", url).get_or_build(third, builder(third, []))
    ops = host(monkeypatch, tmp_path, "ops", url)
    assert main(["cache", "explain", url, good.key[:12], third.key[:12], "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["key_a"] == good.key and json.loads(out)["key_b"] == third.key
    assert f"{good.key}: downloaded from {url} and checked" in err and f"{third.key}: downloaded from {url}" in err
    assert sorted(e.key for e in ops.entries()) == sorted([good.key, third.key])  # the damaged one stays remote
    assert main(["cache", "explain", url, good.key, bad.key]) == 2
    _, err = capsys.readouterr()
    assert f"cache entry {bad.key}: the remote entry {url}/{bad.key}/ did not check out" in err


def test_unreachable_remote_exits_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    url = f"s3://{BUCKET}/cli-down"
    host(monkeypatch, tmp_path, "a", url)
    for command in (["cache", "ls", url], ["cache", "verify", url]):
        assert main(command) == EXIT_REMOTE == 3
        err = capsys.readouterr().err
        assert f"remote compile cache {url} (endpoint http://127.0.0.1:" in err and "is unreachable" in err
        assert "fix: check the endpoint" in err


def _pending_entry(monkeypatch, tmp_path, url):
    """A captured (pending) entry in host A's copy of ``url``: what ``compile`` builds."""
    key = make_key(f"HloModule pending {tmp_path.name}")
    entry = host(monkeypatch, tmp_path, "a", url).entry(key)
    entry.reset()
    entry.hlo_path.write_bytes(b"HloModule pending")
    entry.write_metadata(new_metadata(key, seam="neuron_libtorch_graph_capture", graph_type="decode",
                                      compiler_args=["-O1"], target="trn2", status="pending"))
    return entry


def test_compile_on_an_unreachable_remote_exits_3_and_builds_nothing(monkeypatch, tmp_path, capsys):
    """``compile`` builds for the remote: like the ``cache`` commands it exits 3 when the remote cannot be used,
    not 0 or 1 after building graphs nobody else will see."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    url = f"s3://{BUCKET}/cli-down-compile"
    entry = _pending_entry(monkeypatch, tmp_path, url)
    assert main(["compile", url, "--workers", "1"]) == EXIT_REMOTE
    out, err = capsys.readouterr()
    assert f"neuron-args: remote compile cache {url} (endpoint http://127.0.0.1:" in err and "is unreachable" in err
    assert "fix: check the endpoint" in err and "compiling" not in err and out == ""
    assert entry.status == "pending" and not entry.executable_path.exists()


def test_ctrl_c_after_the_remote_went_down_exits_130_not_3(monkeypatch, tmp_path, capsys):
    """Ctrl-C wins over a remote that went down midway: the interrupted run exits 130 (as without a remote), and
    its entries stay pending."""
    import importlib

    from neuron_args import remote_cache

    parallel_compile = importlib.import_module("neuron_args.deferred.parallel_compile")  # the module, not the function

    url = f"s3://{BUCKET}/cli-ctrl-c-{tmp_path.name[-16:]}"
    entry = _pending_entry(monkeypatch, tmp_path, url)

    def down_then_interrupted(root, **_):  # an upload found the endpoint gone, then the user pressed Ctrl-C
        remote_cache.store_for(root).go_down("ConnectTimeoutError", entry.key, "decode", while_="uploading")
        raise KeyboardInterrupt

    monkeypatch.setattr(parallel_compile, "parallel_compile", down_then_interrupted)
    assert main(["compile", url, "--workers", "1"]) == 130
    err = capsys.readouterr().err
    assert "interrupted; 1 entries stay pending" in err and "went unreachable" not in err
    assert entry.status == "pending"


def test_refused_credentials_exit_3(monkeypatch, tmp_path, capsys):
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks credentials now
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
    url = f"s3://{BUCKET}/cli-auth"
    host(monkeypatch, tmp_path, "a", url)
    assert main(["cache", "ls", url]) == 3
    err = capsys.readouterr().err
    assert "refused to list its entries" in err and "InvalidAccessKeyId" in err and "fix:" in err


def test_ls_shows_a_malformed_or_older_marker_without_failing(monkeypatch, tmp_path, capsys, client):
    """Markers are untrusted: one that does not parse is a corrupt row; one without the listing fields (an older
    writer) shows its size and '-' for what it does not record."""
    url, prefix = f"s3://{BUCKET}/cli-markers", "cli-markers"
    broken, older = make_key("HloModule broken marker"), make_key("HloModule older marker")
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{broken.key}/COMPLETE", Body=b"{not json")
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{older.key}/COMPLETE", Body=json.dumps({
        "format": 1, "key": older.key, "folder": "a" * 32,
        "files": {"graph.hlo": {"size": 3, "sha256": "0" * 64}, "metadata.json": {"size": 40, "sha256": "1" * 64}}}))
    host(monkeypatch, tmp_path, "ops", url)
    assert main(["cache", "ls", "--json", url]) == 0
    rows = {e["key"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    assert (rows[broken.key]["status"], rows[broken.key]["size"]) == ("corrupt", None)
    assert (rows[older.key]["status"], rows[older.key]["size"], rows[older.key]["graph_type"],
            rows[older.key]["compiler_args"]) == ("complete", 43, None, None)
    assert rows[older.key]["created"] is not None  # the marker object's time when the marker records none


def test_ls_rows_follow_the_local_listing_rules(monkeypatch, tmp_path, capsys, client):
    """A row of an s3:// listing is a local ``cache ls`` row plus where it is: the same fields, an -O level shown
    '-' is null in JSON (whether or not arguments were recorded), a compiling entry's holder is ``lock_pid``."""
    import os

    from neuron_args.cache import KeyLock

    url, prefix = f"s3://{BUCKET}/cli-rules-{tmp_path.name[-16:]}", f"cli-rules-{tmp_path.name[-16:]}"
    no_level, building = make_key("HloModule no level"), make_key("HloModule building")
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{no_level.key}/COMPLETE", Body=json.dumps({
        "format": 1, "key": no_level.key, "folder": "a" * 32, "compiler_args": ["--auto-cast=none"],
        "files": {"graph.hlo": {"size": 3, "sha256": "0" * 64}}}))
    ops = host(monkeypatch, tmp_path, "ops", url)
    lock = KeyLock(ops.entry(building))
    assert lock.acquire()
    try:
        ops.entry(building).reset()
        assert main(["cache", "ls", "--json", url]) == 0
        rows = {e["key"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
        assert main(["cache", "ls", "--json", "--status", "compiling", url]) == 0
        only = [e["key"] for e in json.loads(capsys.readouterr().out)["entries"]]
        assert main(["cache", "ls", url]) == 0
        table = capsys.readouterr().out
    finally:
        lock.release()
    local = {"key", "graph_type", "opt_level", "status", "lock_pid", "size"}
    assert all(local | {"compiler_args", "created", "remote", "local_status"} <= set(e) for e in rows.values())
    assert (rows[no_level.key]["opt_level"], rows[building.key]["opt_level"]) == (None, None)
    assert (rows[building.key]["status"], rows[building.key]["lock_pid"]) == ("compiling", os.getpid())
    assert rows[no_level.key]["lock_pid"] is None and only == [building.key]
    assert f"compiling (pid {os.getpid()})" in table


def test_explain_names_candidates_from_the_remote_and_the_local_copy(monkeypatch, tmp_path, capsys, client):
    """A key prefix is matched against the remote's markers and the local copy's folders together: one in each is
    ambiguous, and the message names both and where they were looked for."""
    url, prefix = f"s3://{BUCKET}/cli-prefix-{tmp_path.name[-16:]}", f"cli-prefix-{tmp_path.name[-16:]}"
    remote_key, local_key = "ab" + "0" * 30, "ab" + "1" * 30
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{remote_key}/COMPLETE", Body=b"{}")
    ops = host(monkeypatch, tmp_path, "ops", url)
    ops.entry(local_key).path.mkdir(parents=True)
    assert main(["cache", "explain", url, "AB", local_key]) == 2
    err = capsys.readouterr().err
    assert (f"key prefix 'AB' is ambiguous in {url} and its local copy: 2 entries ({remote_key}, {local_key}); "
            "give more characters") in err
    assert main(["cache", "explain", url, "abc", local_key]) == 2
    assert f"no cache entry in {ops.root} has a key starting with 'abc'" in capsys.readouterr().err
