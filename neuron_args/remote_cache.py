"""A compile cache shared across hosts through S3-compatible storage (``cache_dir="s3://bucket/prefix"``).

An ``s3://`` cache_dir is a local read-through copy bound to its remote (``<copy>/.remote.json``). A remote entry
exists once its marker ``<prefix>/<key>/COMPLETE`` (each file's size and sha256) is written, LAST and with
``If-None-Match: *`` after files in a content-addressed folder: two hosts building one key need no lock across
hosts. :func:`pull` downloads on a local miss, checks, and renames into place whole; :func:`publish` uploads once
the key lock is released. An unreachable endpoint is one loud warning, then local-only; refused credentials are a
:class:`RemoteCacheError`. boto3, not s3fs: fewer dependencies, a faster import, no asyncio layer.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from neuron_args import envs
from neuron_args.atomic import file_stamp, remove_path, write_atomic
from neuron_args.cache_key import is_cache_key
from neuron_args.errors import CorruptEntryError, OptionsError
from neuron_args.text import graph_label
from neuron_args.untrusted import METADATA_LIMIT, is_sha256, load_json, read_json, stream_sha256

log = logging.getLogger("neuron_args.remote_cache")

SCHEME = "s3://"
COPY_ENV = "NEURON_ARGS_REMOTE_CACHE_COPY"
TIMEOUT_ENV = "NEURON_ARGS_REMOTE_CACHE_TIMEOUT"
BINDING_FILE = ".remote.json"
INCOMING_DIR = ".remote-incoming"  # a dot folder: never listed as an entry
REMOTE_MARKER = "COMPLETE"
MARKER_FORMAT = 1
MARKER_LIMIT = 1 << 20
#: The largest file a remote entry may hold (an executable: far above any NEFF, far below a full disk).
FILE_LIMIT = 64 << 30
_CHUNK = 1 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_PART = re.compile(r"^[A-Za-z0-9._\-=+@]+$")
_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,200}$")
_ID = re.compile(r"^[0-9a-f]{32}$")


class RemoteCacheError(OptionsError):
    """The remote refused this process (credentials, permissions, no bucket) or boto3 is missing."""


class EntryLike(Protocol):
    """What the hooks need of a :class:`~neuron_args.cache.CacheEntry` (the cache imports this module)."""

    root: Path
    key: str
    path: Path

    @property
    def marker_path(self) -> Path: ...

    def problem(self, *, checksum: bool = True) -> str | None: ...

    def info(self) -> Any: ...


@dataclass(frozen=True)
class RemoteLocation:
    """``s3://bucket/prefix``, parsed and validated once where it enters."""

    bucket: str
    prefix: str  # "" or "a/b" (no leading or trailing slash)

    @classmethod
    def parse(cls, url: str) -> RemoteLocation:
        if not is_remote(url):
            raise OptionsError(f"cache_dir {url!r} is not an s3:// URL")
        rest = url[len(SCHEME):].strip("/")
        bucket, _, prefix = rest.partition("/")
        parts = [p for p in prefix.split("/") if p]
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise OptionsError(f"cache_dir {url!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
                               "dots and hyphens). Fix: give cache_dir as s3://BUCKET/PREFIX")
        bad = [p for p in parts if p in (".", "..") or not _PART.fullmatch(p)]
        if bad:
            raise OptionsError(f"cache_dir {url!r}: the prefix part {bad[0]!r} is not allowed (letters, digits and "
                               "._-=+@ only, no '.' or '..'). Fix: give cache_dir as s3://BUCKET/PREFIX")
        return cls(bucket, "/".join(parts))

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")

    def object_key(self, *names: str) -> str:
        return "/".join([p for p in (self.prefix,) if p] + list(names))

    def entry_url(self, key: str) -> str:
        return f"{self.url}/{key}/"


def is_remote(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower().startswith(SCHEME)


def local_copy(url: str, default_base: Path) -> Path:
    """The local folder bound to ``url``: ``<$NEURON_ARGS_REMOTE_CACHE_COPY or default_base>/<bucket>/<prefix>``."""
    loc = RemoteLocation.parse(url.strip())
    given = envs.text(COPY_ENV)
    base = Path(given).expanduser() if given else default_base
    root = (base / loc.bucket).joinpath(*loc.prefix.split("/")) if loc.prefix else base / loc.bucket
    bind(root, loc)
    return root.resolve()


def bind(root: Path, loc: RemoteLocation) -> None:
    """Record in ``root`` that it is the local copy of ``loc`` (one folder copies one remote)."""
    path = root / BINDING_FILE
    current = _binding(root)
    if current == loc:
        return
    if current is not None:
        raise OptionsError(f"{root} is already the local copy of {current.url}, not of {loc.url}. Fix: point "
                           f"${COPY_ENV} at another folder, or remove {path}")
    try:
        write_atomic(path, json.dumps({"url": loc.url}) + "\n")
    except OSError as exc:
        raise OptionsError(f"cannot create the local copy {root} of the remote cache {loc.url} ({exc.strerror or exc}). "
                           f"Fix: point ${COPY_ENV} at a writable folder") from None
    _stores.pop(str(root.resolve()), None)


def _binding(root: Path) -> RemoteLocation | None:
    try:
        doc = read_json(root / BINDING_FILE, 4096)
        return RemoteLocation.parse(doc["url"]) if isinstance(doc, dict) and is_remote(doc.get("url")) else None
    except (OSError, ValueError):
        return None


def remote_url(root: Path) -> str | None:
    """The ``s3://`` URL the cache folder ``root`` copies, or None (a plain local cache)."""
    loc = _binding(root)
    return None if loc is None else loc.url


_stores: dict[str, S3Store | None] = {}
_stores_lock = threading.Lock()


def store_for(root: Path) -> S3Store | None:
    """The remote store of the cache folder ``root`` (None: a plain local cache), one per folder."""
    ident = str(root)
    with _stores_lock:
        if ident not in _stores:
            loc = _binding(root)
            _stores[ident] = None if loc is None else S3Store(loc)
        return _stores[ident]


class _Absent(Exception):
    """The object does not exist (404)."""


class _Exists(Exception):
    """A conditional write found the object there already (412)."""


class _Unavailable(Exception):
    """The endpoint did not answer (refused, timed out, 5xx after retries)."""


class S3Store:
    """One remote cache's objects; every fault is sorted into absent, exists, unavailable or :class:`RemoteCacheError`."""

    def __init__(self, loc: RemoteLocation) -> None:
        self.loc = loc
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.down: str | None = None  # why this process went local-only
        self.upload_refused = False  # a read-only host: its first refused upload warns, later ones are info
        self.replace: set[str] = set()  # keys whose remote entry a reader found corrupt

    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError:
                    raise RemoteCacheError(
                        f"the compile cache {self.loc.url} is on S3, and boto3 is not installed. "
                        "Fix: pip install 'neuron-args[s3]'") from None
                t = envs.seconds(TIMEOUT_ENV, hint=" (the S3 client's connect and read timeout)")
                self._client = boto3.session.Session().client(
                    "s3", config=Config(connect_timeout=t, read_timeout=t, retries={"mode": "standard"}))
            return self._client

    @property
    def endpoint(self) -> str:
        try:
            return str(self.client.meta.endpoint_url)
        except RemoteCacheError:
            return "<no client>"

    @contextlib.contextmanager
    def _call(self, what: str, key: str | None, graph_type: str | None) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        try:
            yield
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
                raise _Absent() from None
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or status in (409, 412):
                raise _Exists() from None
            if isinstance(status, int) and status >= 500:
                raise _Unavailable(f"{code or status}: {err.get('Message', '')}") from None
            raise self.refused(what, key, graph_type, f"{code or status}: {err.get('Message', '')}") from None
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise self.refused(what, key, graph_type, str(exc)) from None
        except BotoCoreError as exc:  # connection refused, timeouts, a connection closed mid-body
            raise _Unavailable(f"{type(exc).__name__}: {exc}") from None

    def refused(self, what: str, key: str | None, graph_type: str | None, why: str) -> RemoteCacheError:
        target = "its entries" if key is None else f"cache entry {key} ({graph_label(graph_type)})"
        return RemoteCacheError(
            f"remote compile cache {self.loc.url} (endpoint {self.endpoint}) refused to {what} {target}: {why}.\n"
            f"fix: give this host credentials that may read and write {self.loc.url} (the standard AWS "
            "configuration: AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, an instance role; "
            f"AWS_ENDPOINT_URL for an S3-compatible server) and check that bucket "
            f"{self.loc.bucket!r} exists, or use a local cache_dir")

    def go_down(self, why: str, key: str, graph_type: str | None, *, while_: str = "looking up") -> None:
        """Warn once, loudly, then work local-only for the rest of this process."""
        if self.down is None:
            self.down = why
            log.warning(
                "remote compile cache %s (endpoint %s) is unreachable while " + while_ + " cache entry %s (%s): %s. "
                "This process goes on with its local copy only: graphs it misses are built here and not shared. "
                "fix: check the endpoint (AWS_ENDPOINT_URL, the network) and %s, then run again",
                self.loc.url, self.endpoint, key, graph_label(graph_type), why, TIMEOUT_ENV)

    def read(self, name: str, limit: int, key: str, graph_type: str | None, into: Callable[[bytes], Any]) -> int:
        """Stream the object ``name`` into ``into``, at most ``limit`` + 1 bytes; returns how many were read."""
        got = 0
        with self._call("read", key, graph_type):
            body = self.client.get_object(Bucket=self.loc.bucket, Key=name)["Body"]
            try:
                while got <= limit and (chunk := body.read(min(_CHUNK, limit + 1 - got))):
                    got += len(chunk)
                    into(chunk)
            finally:
                body.close()
        return got

    def get_file(self, name: str, dest: Path, size: int, key: str, graph_type: str | None) -> str:
        """Download ``name`` into ``dest`` (at most ``size`` + 1 bytes read); returns its sha256."""
        digest = hashlib.sha256()
        with open(dest, "wb") as f:
            got = self.read(name, size, key, graph_type, lambda chunk: (digest.update(chunk), f.write(chunk)))
        if got != size:
            raise ValueError(f"{name} has {'more than ' if got > size else ''}{got} bytes, {size} were recorded")
        return digest.hexdigest()

    def put(self, name: str, data: bytes | BinaryIO, key: str, graph_type: str | None, *, create: bool = False) -> None:
        """Write one object (``create``: only when absent, ``If-None-Match: *``; 412 raises :class:`_Exists`)."""
        extra = {"IfNoneMatch": "*"} if create else {}
        with self._call("write", key, graph_type):
            self.client.put_object(Bucket=self.loc.bucket, Key=name, Body=data, **extra)

    def markers(self) -> list[tuple[str, str | None]]:
        """``(key, the marker's last-modified time)`` of every remote marker, sorted by key (one listing, no reads)."""
        out = []
        start = self.loc.object_key("")
        with self._call("list", None, None):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=start):
                for obj in page.get("Contents", []):
                    parts = obj["Key"][len(start):].split("/")
                    if len(parts) == 2 and parts[1] == REMOTE_MARKER and is_cache_key(parts[0]):
                        when = obj.get("LastModified")
                        out.append((parts[0], when.isoformat(timespec="seconds") if hasattr(when, "isoformat") else None))
        return sorted(out)

    def marker_bytes(self, key: str, graph_type: str | None = None) -> bytes:
        """The remote marker of ``key`` as stored (one bounded read); :class:`_Absent` when there is none."""
        name, chunks = self.loc.object_key(key, REMOTE_MARKER), []
        if self.read(name, MARKER_LIMIT, key, graph_type, chunks.append) > MARKER_LIMIT:
            raise ValueError(f"{name} has more than the {MARKER_LIMIT} bytes allowed")
        return b"".join(chunks)

    def marker(self, key: str) -> Marker | None:
        """The parsed remote marker of ``key``, None when absent; ValueError when malformed."""
        try:
            raw = self.marker_bytes(key)
        except _Absent:
            return None
        return Marker.parse(raw, key, self.loc)

    def probe(self) -> None:
        """One listing of at most one object: whether this host may list the remote (see :meth:`reachable`)."""
        with self._call("list", None, None):
            self.client.list_objects_v2(Bucket=self.loc.bucket, Prefix=self.loc.object_key(""), MaxKeys=1)

    @contextlib.contextmanager
    def reachable(self) -> Iterator[None]:
        """For a command that must reach the remote (the CLI): unreachable is a :class:`RemoteCacheError`."""
        try:
            yield
        except _Unavailable as exc:
            raise self.unreachable(f"is unreachable: {exc}") from None
        if self.down is not None:
            raise self.unreachable(f"went unreachable: {self.down}")

    def unreachable(self, what: str) -> RemoteCacheError:
        return RemoteCacheError(f"remote compile cache {self.loc.url} (endpoint {self.endpoint}) {what}.\nfix: check "
                                f"the endpoint (AWS_ENDPOINT_URL, the network) and {TIMEOUT_ENV}, then run again")


@dataclass(frozen=True)
class Marker:
    """A remote marker: its upload folder, ``{name: (size, sha256)}`` and what ``cache ls`` shows without a download."""

    folder: str
    files: dict[str, tuple[int, str]]
    graph_type: str | None
    compiler_args: list[str] | None
    created: str | None

    @property
    def size(self) -> int:
        return sum(size for size, _ in self.files.values())

    @classmethod
    def parse(cls, raw: bytes, key: str, loc: RemoteLocation) -> Marker:
        """Untrusted bytes: every field checked (ValueError); a listing field is None when malformed or absent."""
        doc = load_json(raw, f"{loc.entry_url(key)}{REMOTE_MARKER}")
        if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT or doc.get("key") != key:
            raise ValueError("the marker is not a neuron-args remote marker of this key")
        folder, files = doc.get("folder"), doc.get("files")
        if not isinstance(folder, str) or not _ID.fullmatch(folder) or not isinstance(files, dict) or not files:
            raise ValueError("the marker names no upload folder or no files")
        out = {}
        for name, info in files.items():
            size, sha = (info.get("size"), info.get("sha256")) if isinstance(info, dict) else (None, None)
            if (not _NAME.fullmatch(name) or name.startswith(".") or name == REMOTE_MARKER or not isinstance(size, int)
                    or isinstance(size, bool) or not 0 <= size <= FILE_LIMIT or not is_sha256(sha)
                    or (name.endswith(".json") and size > METADATA_LIMIT)):
                raise ValueError(f"the marker's file entry {name[:80]!r} is malformed")
            out[name] = (size, sha)
        graph_type, args, created = doc.get("graph_type"), doc.get("compiler_args"), doc.get("created")
        ok_args = isinstance(args, list) and len(args) <= 1000 and all(isinstance(a, str) and len(a) <= 4096 for a in args)
        return cls(folder, out, graph_type if isinstance(graph_type, str) and len(graph_type) <= 200 else None,
                   list(args) if ok_args else None, created if isinstance(created, str) and len(created) <= 64 else None)


def pull(entry: EntryLike, *, lock: Callable[[], AbstractContextManager[Any]], graph_type: str | None = None) -> bool:
    """Copy the remote entry of ``entry.key`` when its marker exists; True when the local entry is complete then
    (one that does not check out is a logged miss)."""
    store = store_for(entry.root)
    if store is None or store.down is not None:
        return False
    key = entry.key
    try:
        try:
            raw = store.marker_bytes(key, graph_type)
        except _Absent:
            return False
        with lock():
            if entry.marker_path.exists():  # another process of this host copied or built it meanwhile
                return True
            return _download(store, entry, raw, graph_type)
    except _Unavailable as exc:
        store.go_down(str(exc), key, graph_type)
        return False
    except OSError as exc:  # this host's disk (full, read-only): the build that follows reports it
        log.warning("cache entry %s (%s) was not copied from %s: %s", key, graph_label(graph_type), store.loc.url, exc)
        return False


def _download(store: S3Store, entry: EntryLike, raw: bytes, graph_type: str | None) -> bool:
    key = entry.key
    incoming = entry.root / INCOMING_DIR / f"{os.getpid()}-{secrets.token_hex(4)}"
    staged = incoming / key
    try:
        marker = Marker.parse(raw, key, store.loc)
        staged.mkdir(parents=True)
        for name, (size, sha) in sorted(marker.files.items()):
            got = store.get_file(store.loc.object_key(key, marker.folder, name), staged / name, size, key, graph_type)
            if got != sha:
                raise ValueError(f"{name}'s sha256 is {got[:16]}..., the marker recorded {sha[:16]}...")
        write_atomic(staged / entry.marker_path.name, raw)
        problem = type(entry)(incoming, key).problem()  # the cache's own check: metadata, size, sha256, signature
        if problem is not None:
            raise ValueError(problem)
        remove_path(entry.path)  # an incomplete local entry (pending, failed): the remote one replaces it
        os.replace(staged, entry.path)
    except (_Absent, ValueError) as exc:
        store.replace.add(key)
        log.warning("remote cache entry %s (%s) is not loaded: %s; it is a miss and is rebuilt here (and the "
                    "rebuild replaces it remotely)", store.loc.entry_url(key), graph_label(graph_type),
                    exc if not isinstance(exc, _Absent) else "a file its marker names is missing")
        return False
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    log.info("copied cache entry %s (%s) from %s", key, graph_label(graph_type), store.loc.url)
    return True


def publish(entry: EntryLike, graph_type: str | None = None) -> bool:
    """Upload the complete local ``entry``, the marker last; True when this host's marker stands (a failure warns).
    Outside the key's lock, so each file is opened once and uploaded from that descriptor, and the local marker
    must be the same before and after the opens: one complete build, never a mix of two."""
    store = store_for(entry.root)
    if store is None or store.down is not None:
        return False
    key = entry.key
    with contextlib.ExitStack() as opened:
        try:
            stamp = file_stamp(entry.marker_path)
            names = sorted(p.name for p in entry.path.iterdir()
                           if p.is_file() and not p.is_symlink() and p.name != entry.marker_path.name
                           and not p.name.startswith(".") and _NAME.fullmatch(p.name))
            md = entry.info()  # what `cache ls` shows of the entry, before the marker check below
            handles = {n: opened.enter_context(open(entry.path / n, "rb")) for n in names}
            if stamp is None or file_stamp(entry.marker_path) != stamp:
                log.info("cache entry %s (%s) was replaced locally before its upload; the build that replaced it "
                         "uploads it", key, graph_label(graph_type))
                return False
            files = {n: {"size": os.fstat(f.fileno()).st_size, "sha256": stream_sha256(f)} for n, f in handles.items()}
            folder = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:32]
            for name, f in handles.items():
                f.seek(0)
                store.put(store.loc.object_key(key, folder, name), f, key, graph_type)
            marker = json.dumps({"format": MARKER_FORMAT, "key": key, "folder": folder, "files": files,
                                 "host": socket.gethostname(), "graph_type": md.graph_type, "created": md.created,
                                 "compiler_args": None if md.compiler_args is None else list(md.compiler_args)},
                                sort_keys=True).encode()
            # If-None-Match unless a reader found the remote entry corrupt: then this build replaces it
            store.put(store.loc.object_key(key, REMOTE_MARKER), marker, key, graph_type,
                      create=key not in store.replace)
            store.replace.discard(key)
            return _kept(store, key, graph_type, marker, folder)
        except _Exists:
            log.info("cache entry %s (%s) is already in %s (another host published it first)", key,
                     graph_label(graph_type), store.loc.url)
            return False
        except _Unavailable as exc:
            store.go_down(str(exc), key, graph_type, while_="uploading")
            return False
        except (RemoteCacheError, OSError, CorruptEntryError) as exc:
            refused, store.upload_refused = store.upload_refused, store.upload_refused or isinstance(exc, RemoteCacheError)
            log.log(logging.INFO if refused else logging.WARNING, "cache entry %s (%s) was built here but not uploaded "
                    "to %s (endpoint %s): %s. It is used from this host's copy; other hosts build it themselves. fix: "
                    "check the endpoint and this host's write permission on the bucket", key, graph_label(graph_type),
                    store.loc.url, store.endpoint, exc)
            return False


def _kept(store: S3Store, key: str, graph_type: str | None, marker: bytes, folder: str) -> bool:
    """Read the marker back: an endpoint that ignores ``If-None-Match`` lets the last writer win (either is a
    sound entry); logs which won. True when this host's marker stands."""
    try:
        got = store.marker_bytes(key, graph_type)
    except (_Absent, _Unavailable, ValueError) as exc:
        log.warning("cache entry %s (%s): its marker in %s could not be read back after the upload (%s); the "
                    "next reader checks it", key, graph_label(graph_type), store.loc.url, exc or "absent")
        return False
    if got == marker:
        return True
    try:
        doc = load_json(got, f"{store.loc.entry_url(key)}{REMOTE_MARKER}")
        won = f"host {str(doc.get('host'))[:100]!r}, upload folder {str(doc.get('folder'))[:32]}"
    except (ValueError, AttributeError):
        won = "an unreadable marker (the next reader treats it as a miss)"
    log.warning("cache entry %s (%s): another writer's marker replaced this host's in %s (endpoint %s): the entry "
                "there now is %s, not this host's upload folder %s. The endpoint does not honour If-None-Match "
                "(conditional writes), so the last writer wins; both uploads are complete entries, and readers load "
                "the one that won", key, graph_label(graph_type), store.loc.url, store.endpoint, won, folder)
    return False
