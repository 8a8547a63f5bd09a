"""Uploads to an ``s3://`` cache against the moto server: outside the key's lock, a failed upload warned once,
and an endpoint that ignores conditional writes (If-None-Match) detected by reading the marker back."""
from __future__ import annotations

import json
import logging
import threading

import pytest

from neuron_args import remote_cache
from neuron_args.cache import KeyLock
from tests.remote.s3_helpers import BUCKET, builder, host, make_key, remote_objects


def test_upload_runs_after_the_key_lock_is_released(monkeypatch, tmp_path, client):
    """A stalled upload holds no other local build of the key: the lock is free while it waits."""
    url = f"s3://{BUCKET}/unlocked"
    key = make_key("HloModule unlocked")
    cache = host(monkeypatch, tmp_path, "a", url)
    uploading, go_on = threading.Event(), threading.Event()
    real_put = remote_cache.S3Store.put

    def stalled_put(self, *args, **kwargs):
        uploading.set()
        go_on.wait(120)  # a bound for a broken run only: the test sets it below
        return real_put(self, *args, **kwargs)

    monkeypatch.setattr(remote_cache.S3Store, "put", stalled_put)
    done: dict = {}
    builds = threading.Thread(target=lambda: done.update(result=cache.get_or_build(key, builder(key, []))))
    builds.start()
    try:
        assert uploading.wait(120), "the build never started its upload"
        other = KeyLock(cache.entry(key))  # another local build of the key
        took = other.acquire(0)
        if took:
            other.release()
        complete_locally = cache.entry(key).is_complete
        uploaded_meanwhile = remote_objects(client, f"unlocked/{key.key}/")
    finally:
        go_on.set()
        builds.join(120)
    assert took, "the key's lock was held while the upload was stalled"
    assert complete_locally and uploaded_meanwhile == []
    entry, hit = done["result"]
    assert hit is False and entry.status == "complete"
    assert f"unlocked/{key.key}/COMPLETE" in remote_objects(client, f"unlocked/{key.key}/")


def test_failed_upload_warns_once_then_works_local_only(monkeypatch, tmp_path, caplog):
    url = f"s3://{BUCKET}/upload-down"
    cache, calls = host(monkeypatch, tmp_path, "a", url), []
    puts: list[str] = []

    def unreachable(self, name, *args, **kwargs):
        puts.append(name)
        raise remote_cache._Unavailable("ConnectTimeoutError: the network went away")

    monkeypatch.setattr(remote_cache.S3Store, "put", unreachable)
    keys = [make_key("HloModule upload down"), make_key("HloModule upload down 2")]
    with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
        for key in keys:
            entry, hit = cache.get_or_build(key, builder(key, calls), graph_type="decode")
            assert hit is False and entry.status == "complete"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "unreachable while uploading cache entry" in warned[0] and keys[0].key in warned[0]
    assert "'decode'" in warned[0] and "local copy only" in warned[0]
    assert len(puts) == 1 and keys[0].key in puts[0]  # the second entry never tried the network
    assert len(calls) == 2


def test_moto_honours_if_none_match(client):
    """What the publishers rely on, checked on the server the suite runs: a conditional put of an existing
    object is refused with 412."""
    from botocore.exceptions import ClientError

    client.put_object(Bucket=BUCKET, Key="conditional/COMPLETE", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=BUCKET, Key="conditional/COMPLETE", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=BUCKET, Key="conditional/COMPLETE")["Body"].read() == b"first"


def test_endpoint_ignoring_if_none_match_is_detected_and_the_winner_logged(monkeypatch, tmp_path, client, caplog):
    """An endpoint that drops If-None-Match lets the last marker win: the host reads its marker back, sees
    another host's and logs which entry won (the other host wrote right after it, as a race would)."""
    url = f"s3://{BUCKET}/no-conditional"
    key = make_key("HloModule no conditional")
    cache = host(monkeypatch, tmp_path, "a", url)
    entry = cache.entry(key)
    entry.reset()
    builder(key, [], b"bytes of A")(entry)
    entry.marker_path.write_text("now")
    marker_name = f"no-conditional/{key.key}/COMPLETE"
    theirs = json.dumps({"format": 1, "key": key.key, "folder": "f" * 32, "host": "host-b",
                         "files": {"graph.hlo": {"size": 3, "sha256": "0" * 64}}}).encode()
    store = remote_cache.store_for(cache.root)

    def drop_condition(request, **_):
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]

    store.client.meta.events.register("before-sign.s3.PutObject", drop_condition)
    client.put_object(Bucket=BUCKET, Key=marker_name, Body=b"{}")  # a marker there already: ignored condition
    real_put = remote_cache.S3Store.put

    def put_then_other_host(self, name, *args, **kwargs):
        real_put(self, name, *args, **kwargs)
        if name == marker_name:
            client.put_object(Bucket=BUCKET, Key=marker_name, Body=theirs)

    monkeypatch.setattr(remote_cache.S3Store, "put", put_then_other_host)
    with caplog.at_level(logging.WARNING, logger="neuron_args.remote_cache"):
        assert remote_cache.publish(entry, "decode") is False
    text = caplog.text
    assert "does not honour If-None-Match" in text and key.key in text and "'decode'" in text
    assert "host 'host-b', upload folder " + "f" * 32 in text
    assert client.get_object(Bucket=BUCKET, Key=marker_name)["Body"].read() == theirs
