"""``cache ls``, ``explain`` and ``verify`` on an ``s3://`` cache: ls reads only the remote's markers, explain
downloads (and checks) the entries it names, verify (:func:`sync`) every one."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from neuron_args import remote_cache
from neuron_args.cache import CacheEntry, CompileCache, EntryStatus
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CorruptEntryError
from neuron_args.manifest.show import SHORT_HASH, CacheEntryInfo, cache_entries, opt_level, status_counts
from neuron_args.text import human_size, render_table

READERS = 8


@dataclass(frozen=True)
class RemoteRow(CacheEntryInfo):
    """One ``cache ls`` row of an ``s3://`` cache: a local listing's row (its status text, its JSON form) plus where
    the entry is; a remote entry's fields come from its marker."""

    size: int | None  # None: a remote marker that does not parse
    compiler_args: list[str] | None
    created: str | None
    remote: bool
    local_status: str | None  # the local copy's status of the key, None when it has no folder for it

    @property
    def where(self) -> str:
        if not self.remote:
            return "local only"
        return "remote+local" if self.local_status == EntryStatus.COMPLETE.value else "remote"


def _remote_row(store: remote_cache.S3Store, key: str, modified: str | None, local: str | None) -> RemoteRow:
    try:
        marker = store.marker(key)
    except ValueError:
        return RemoteRow(key, None, "-", EntryStatus.CORRUPT, None, None, None, modified, True, local)
    if marker is None:  # removed between the listing and the read
        return RemoteRow(key, None, "-", EntryStatus.MISSING, None, None, None, modified, True, local)
    return RemoteRow(key, marker.graph_type, opt_level(marker.compiler_args), EntryStatus.COMPLETE, None, marker.size,
                     marker.compiler_args, marker.created or modified, True, local)


def list_remote(cache: CompileCache) -> list[RemoteRow] | None:
    """Every remote entry (from its marker) and every local-only one, by graph type then key (None: a local cache)."""
    store = remote_cache.store_for(cache.root)
    if store is None:
        return None
    local = {info.key: info for info in cache_entries(cache)}
    with store.reachable():
        markers = store.markers()
        with ThreadPoolExecutor(READERS) as pool:
            rows = list(pool.map(lambda km: _remote_row(store, km[0], km[1], local[km[0]].status.value
                                                        if km[0] in local else None), markers))
    listed = {row.key for row in rows}
    for info in local.values():
        if info.key not in listed:
            try:
                md = cache.entry(info.key).info()
            except CorruptEntryError:  # shown as corrupt, without its fields
                md = EntryMetadata()
            args = None if md.compiler_args is None else list(md.compiler_args)
            rows.append(RemoteRow(**vars(info), compiler_args=args, created=md.created, remote=False,
                                  local_status=info.status.value))
    return sorted(rows, key=lambda r: (r.graph_type is None, r.graph_type or "", r.key))


def remote_table(rows: list[RemoteRow]) -> str:
    """The ``cache ls`` table of an ``s3://`` cache: the local columns, then CREATED and WHERE."""
    table = render_table(
        ["GRAPH TYPE", "KEY", "-O", "STATUS", "SIZE", "CREATED", "WHERE"],
        [[r.graph_type or "-", r.key[:SHORT_HASH], r.opt_level, r.status_text,
          "-" if r.size is None else human_size(r.size), r.created or "-", r.where] for r in rows])
    remote = [r for r in rows if r.remote]
    shown = ", ".join(f"{n} {status}" for status, n in status_counts([r.status for r in remote]).items()) or "none"
    copied = sum(r.where == "remote+local" for r in remote)
    return (f"{table}\n{len(remote)} remote entr{'y' if len(remote) == 1 else 'ies'} ({shown}), "
            f"{human_size(sum(r.size or 0 for r in remote))}; {copied} also in the local copy; "
            f"{len(rows) - len(remote)} only in the local copy")


def fetch_named(cache: CompileCache, prefix: str) -> tuple[CacheEntry, str | None]:
    """The one entry whose key starts with ``prefix`` (:meth:`CompileCache.find`) and, of an ``s3://`` cache, what made
    it local (downloaded and checked when missing; None: a plain local cache); KeyError when none or several match or
    the remote entry does not check out."""
    store = remote_cache.store_for(cache.root)
    if store is None:
        return cache.find(prefix), None
    with store.reachable():
        entry = cache.find(prefix, remote=store)
        if entry.is_complete:
            return entry, f"{entry.key}: the local copy's entry (not downloaded again)"
        pulled = cache.pull(entry)
    if not pulled:
        raise KeyError(f"cache entry {entry.key}: the remote entry {store.loc.entry_url(entry.key)} did not check out "
                       "on download (the log says why) and the local copy has no complete entry; nothing to explain")
    return entry, (f"{entry.key}: downloaded from {store.loc.url} and checked (size and sha256 from its marker, the "
                   "metadata, the executable's sha256, the signature when signing is on)")


@dataclass
class SyncReport:
    """What :func:`sync` did: entries listed, copied now, and those that did not check out."""

    url: str
    listed: int = 0
    copied: int = 0
    not_loaded: list[str] = field(default_factory=list)

    def line(self) -> str:
        bad = self.not_loaded
        return (f"remote cache {self.url}: {self.listed} complete entr{'y' if self.listed == 1 else 'ies'} listed, "
                f"{self.copied} downloaded to the local copy now, each checked on download (size and sha256 from "
                "its marker, then the cache's own check)"
                + (f", {len(bad)} not loaded (corrupt or unreadable, see the log): {', '.join(bad)}" if bad else ""))


def sync(cache: CompileCache) -> SyncReport | None:
    """Download (and check) every complete remote entry the local copy lacks; None for a plain local cache."""
    store = remote_cache.store_for(cache.root)
    if store is None:
        return None
    report = SyncReport(store.loc.url)
    with store.reachable():
        keys = store.keys()
        report.listed = len(keys)
        for key in keys:
            entry = cache.entry(key)
            if entry.is_complete:
                continue
            if cache.pull(entry):
                report.copied += 1
            elif store.down is None:
                report.not_loaded.append(key)
    return report
