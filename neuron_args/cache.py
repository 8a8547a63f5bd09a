"""The compile cache: one folder per key, a completion marker written last (a crash leaves nothing half-built to
load), a per-key lock; the only code that knows the ``<root>/<key>/`` layout and ``metadata.json``."""
from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import json
import logging
import os
import shlex
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from filelock import FileLock, Timeout

from neuron_args import envs, remote_cache
from neuron_args.activity import ACTIVITY, CacheStats, block_assert_hit, count  # noqa: F401  (CacheStats: re-exported)
from neuron_args.atomic import directory_problem, file_stamp, remove_path, remove_temporaries, write_atomic
from neuron_args.cache_key import CacheKey, explain_components, is_cache_key
from neuron_args.entry_metadata import METADATA_VERSION, EntryMetadata, corrupt, now_iso
from neuron_args.errors import CacheKeyArgsConflict, CacheMissError, CompileError, CorruptEntryError, OptionsError
from neuron_args.flags import CompilerArgs
from neuron_args.signing import SIGNING_KEY_ENV, signature_problem, signed, signing_key
from neuron_args.untrusted import METADATA_LIMIT, UntrustedFileError, open_regular, read_bounded, read_chunks, read_json
from neuron_args.settings import CompileSettings
from neuron_args.text import graph_label

log = logging.getLogger("neuron_args.cache")

CACHE_DIR_ENV = "NEURON_LIBTORCH_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/neuron-args/compile-cache"
ASSERT_CACHE_HIT_ENV = "NEURON_LIBTORCH_ASSERT_CACHE_HIT"
MARKER = "COMPLETE"
HLO_NAME = "graph.hlo"
METADATA_NAME = "metadata.json"
#: Longer than the longest default compile timeout (neuronx-cc, 2 h): only a stuck holder makes a wait give up.
LOCK_TIMEOUT = 3 * 3600.0
_LOCK_POLL = 0.2
#: Seconds a lock wait stays silent before it logs what it waits for (then every ``LOCK_NOTICE_REPEAT``).
LOCK_NOTICE_AFTER = 5.0
LOCK_NOTICE_REPEAT = 600.0
#: Where corrupt entries are moved aside (a dot folder: never listed as an entry).
QUARANTINE_DIR = ".corrupt"
TRACE_MEMO_DIR = ".trace-memo"  # the seams' trace memo (neuron_args.seams.trace_memo): not an entry


def assert_cache_hit_enabled() -> bool:
    """Whether a miss raises: the open serve's say, else the innermost ``activity.tally`` block's, else the variable."""
    if ACTIVITY.assert_hit is not None:
        return ACTIVITY.assert_hit
    block = block_assert_hit()
    return envs.flag(ASSERT_CACHE_HIT_ENV) if block is None else block


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/neuron-args/compile-cache`` when that is an absolute path (the XDG rule), else the default."""
    xdg = envs.text("XDG_CACHE_HOME")
    if os.path.isabs(xdg):
        return Path(xdg) / "neuron-args" / "compile-cache"
    return _expanded(DEFAULT_CACHE_DIR)


def _expanded(path: str) -> Path:
    """``path`` with ``~`` expanded; no home to expand into (a container user without passwd entry) says what to set."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise OptionsError(
            f"compile cache folder {path}: no home directory to expand '~' in ($HOME is unset and user id "
            f"{os.getuid() if hasattr(os, 'getuid') else '?'} has no passwd entry). Fix: give the folder as "
            f"options['cache_dir'], ${CACHE_DIR_ENV} or (pytest) --neuron-cache-dir, or set $HOME or "
            "$XDG_CACHE_HOME") from None


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` (``options["cache_dir"]``), else ``$NEURON_LIBTORCH_CACHE_DIR``, else the per-user default;
    an ``s3://bucket/prefix`` is its local read-through copy (:mod:`neuron_args.remote_cache`)."""
    given = cache_dir or (envs.text(CACHE_DIR_ENV) or None)
    if remote_cache.is_remote(given):
        return remote_cache.local_copy(str(given), default_cache_dir().parent / "remote")
    return _expanded(given) if given else default_cache_dir()


STATS = ACTIVITY.stats
_verified = ACTIVITY.verified
_corrupt = ACTIVITY.corrupt


class EntryStatus(str, enum.Enum):
    """What ``cache ls`` says of an entry (see :attr:`CacheEntry.status`); compares equal to its value."""

    COMPLETE = "complete"
    CORRUPT = "corrupt"
    PENDING = "pending"
    COMPILING = "compiling"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"
    MISSING = "missing"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class EntryArtifacts:
    """An entry's files as the manifest records them: paths relative to the cache root, or None."""

    hlo_path: str | None
    executable_path: str | None
    executable_size: int | None
    executable_mtime: float | None
    output_shapes: tuple[str, ...] | None  # as metadata.json records them (None: not recorded, or corrupt)


def executable_file_name(key: str) -> str:
    """The executable's file name in an entry (or in a farm worker's scratch copy of one)."""
    return f"graph_{key}.neff"


class CacheEntry:
    """The files of one key."""

    def __init__(self, root: Path, key: str) -> None:
        self.root = root
        self.key = key
        self.path = root / key
        self._executable: bytes | None = None  # as verified, until loaded

    executable_name = property(lambda self: executable_file_name(self.key))
    hlo_path = property(lambda self: self.path / HLO_NAME)
    executable_path = property(lambda self: self.path / self.executable_name)
    metadata_path = property(lambda self: self.path / METADATA_NAME)
    marker_path = property(lambda self: self.path / MARKER)
    command_path = property(lambda self: self.path / "command.txt")
    log_path = property(lambda self: self.path / "log-neuron-cc.txt")
    lock_path = property(lambda self: self.root / f".{self.key}.lock")
    is_complete = property(lambda self: self.marker_path.exists())

    @property
    def status(self) -> EntryStatus:
        """``compiling``: a live process holds the key's lock; ``crashed``: a build started and its process died."""
        if self.is_complete:
            return EntryStatus.CORRUPT if self.problem(checksum=False) else EntryStatus.COMPLETE
        if not self.path.is_dir():
            return EntryStatus.MISSING
        state = self.metadata().get("status")  # not parsed: a damaged field must not hide a live build
        if self.lock_pid() is not None:
            return EntryStatus.COMPILING
        if state in ("pending", "failed", "interrupted"):
            return EntryStatus(state)
        return EntryStatus.CRASHED

    def lock_pid(self) -> int | None:
        """The live builder's pid (0 when it wrote none), else None: a dead holder holds no lock."""
        if not self.lock_path.exists():
            return None
        probe = FileLock(self.lock_path)
        try:
            probe.acquire(timeout=0)
        except Timeout:
            try:
                text = read_bounded(self.lock_path, 4096).decode(errors="replace").strip()[:32]
            except (OSError, ValueError):  # a lock file the holder keeps unreadable (Windows), or no regular file
                text = ""
            return int(text) if text.isdigit() else 0
        except OSError:  # unreadable or vanished: nobody we can see holds it
            return None
        probe.release()
        return None

    def _document(self) -> dict[str, Any] | str:
        """The ``metadata.json`` object as written, or why there is none."""
        try:
            value = read_json(os.path.join(os.fspath(self.path), METADATA_NAME), METADATA_LIMIT)
        except FileNotFoundError:
            return "metadata.json is missing"
        except (OSError, ValueError) as exc:
            return f"metadata.json is unreadable ({type(exc).__name__}: {exc})"
        return value if isinstance(value, dict) else f"metadata.json holds a JSON {type(value).__name__}, not an object"

    def metadata(self) -> dict[str, Any]:
        """The ``metadata.json`` document as written (``{}``: unreadable); readers use :meth:`info`."""
        doc = self._document()
        return doc if isinstance(doc, dict) else {}

    has_metadata = property(lambda self: bool(self.metadata()))

    def info(self) -> EntryMetadata:
        """The typed metadata (empty when unreadable); a field of another type raises :class:`CorruptEntryError`."""
        return EntryMetadata.parse(self.metadata(), self.key)

    @property
    def graph_type(self) -> str | None:
        value = self.metadata().get("graph_type")
        return value if isinstance(value, str) else None

    def artifacts(self) -> EntryArtifacts:
        """What a manifest records of the entry (size and mtime from one ``stat``), each None when missing."""
        folder = os.fspath(self.path)
        hlo = os.path.isfile(os.path.join(folder, HLO_NAME))
        exe = self.executable_name
        try:
            st = os.stat(os.path.join(folder, exe))
        except OSError:
            st = None
        try:
            shapes = self.info().output_shapes
        except CorruptEntryError:
            shapes = None
        return EntryArtifacts(
            hlo_path=f"{self.key}/{HLO_NAME}" if hlo else None,
            executable_path=None if st is None else f"{self.key}/{exe}",
            executable_size=None if st is None else st.st_size,
            executable_mtime=None if st is None else st.st_mtime,
            output_shapes=shapes,
        )

    def problem(self, *, checksum: bool = True, keep: bool = False) -> str | None:
        """Why this complete entry cannot be loaded (metadata, signature, executable size and sha256), or None;
        ``keep``: the executable bytes hashed stay for :meth:`executable_bytes` (no second read)."""
        md = self._document()
        if isinstance(md, str):
            return md
        try:
            recorded = EntryMetadata.parse(md, self.key)
        except CorruptEntryError as exc:
            return exc.problem
        if recorded.key is not None and recorded.key != self.key:  # a folder renamed, or files copied across
            return (f"metadata.json is entry {recorded.key}'s, not this one's (the entry's files were moved or copied "
                    "from another entry)")
        untrusted = signature_problem(recorded, self.key)
        if untrusted is not None:
            return untrusted
        try:
            fd, st = open_regular(self.executable_path, follow_links=False)
            try:
                size, want_size, want_sha = st.st_size, recorded.executable_size, recorded.executable_sha256
                if want_size is not None and size != want_size:
                    return f"the executable has {size} bytes, {want_size} were recorded (truncated or replaced)"
                if size == 0:
                    return "the executable is empty"
                digest, kept = hashlib.sha256(), []
                for chunk in read_chunks(fd, st, size, self.executable_path) if checksum else ():
                    digest.update(chunk)
                    if keep:
                        kept.append(chunk)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return f"the executable {self.executable_name} is missing"
        except (UntrustedFileError, OSError) as exc:  # a link, a FIFO; grown or an I/O error while read
            return f"the executable does not read as a file of the entry ({exc})"
        if checksum and want_sha is not None and (got := digest.hexdigest()) != want_sha:
            return f"the executable's sha256 is {got[:16]}..., {want_sha[:16]}... was recorded"
        if keep and checksum:
            self._executable = b"".join(kept)
        return None

    def executable_bytes(self, graph_type: str | None) -> bytes:
        """The executable as :meth:`problem` read and hashed it (kept by the cache's verification), else read and
        checked now: what loads is the bytes checked, read once."""
        if self._executable is None and (problem := self.problem(keep=True)) is not None:
            raise corrupt(self.key, graph_type, problem)
        blob, self._executable = self._executable, None
        assert blob is not None
        return blob

    def write_metadata(self, metadata: EntryMetadata | Mapping[str, Any]) -> None:
        """Write the document (signed when signing is on); a mapping is written as given (tests damage entries so)."""
        doc = metadata.doc if isinstance(metadata, EntryMetadata) else metadata
        write_atomic(self.metadata_path, json.dumps(signed(doc), indent=2, sort_keys=True))

    def update_metadata(self, **fields: Any) -> None:
        self.write_metadata({**self.metadata(), **fields})

    def record_unfinished(self, exc: BaseException) -> None:
        """Say in the metadata that the compiler failed or Ctrl-C stopped it (``cache ls``: ``failed`` or
        ``interrupted``, not ``crashed``); an interrupted pending entry stays pending."""
        interrupted = isinstance(exc, KeyboardInterrupt)
        error = ("interrupted (KeyboardInterrupt) while compiling" if interrupted else
                 (str(exc).splitlines() or [type(exc).__name__])[0][:500])
        with contextlib.suppress(OSError):
            if self.path.is_dir() and not (interrupted and self.metadata().get("status") == "pending"):
                self.update_metadata(status="interrupted" if interrupted else "failed", error=error)

    def mark_complete(self) -> None:
        """Write the marker; a remote cache's copy uploads the entry once the key's lock is released."""
        write_atomic(self.marker_path, now_iso())
        if remote_cache.store_for(self.root) is None:
            return
        if self.lock_path in KeyLock._held:  # uploaded on release: a slow network never holds other local builds
            KeyLock._held[self.lock_path] = True
        else:
            remote_cache.publish(self, self.graph_type)

    def reset(self) -> None:
        """Drop what an unfinished build left (a file or link where the folder belongs too); the caller holds the lock."""
        remove_path(self.path)
        self.path.mkdir(parents=True)

    def size_bytes(self) -> int:
        """Bytes of the entry's regular files (links not followed); 0 when it is gone."""
        total = 0
        try:
            with os.scandir(self.path) as items:
                for item in items:
                    with contextlib.suppress(OSError):
                        if item.is_file(follow_symlinks=False):
                            total += item.stat(follow_symlinks=False).st_size
        except OSError:
            return 0
        return total

    def __repr__(self) -> str:
        return f"CacheEntry({str(self.path)!r}, status={self.status.value!r})"


def _write_pid(lock_path: Path, pid: int | None) -> None:
    """The holder's pid into its lock file, or blanks: padded in place, as ext4 flushes a truncated file on close."""
    with contextlib.suppress(OSError), open(lock_path, "r+b") as handle:
        width = max(_PID_WIDTH, os.fstat(handle.fileno()).st_size)
        handle.write(("" if pid is None else str(pid)).ljust(width).encode())


_PID_WIDTH = 20


class KeyLock:
    """``<root>/.<key>.lock``, held by every writer of the entry (so its taker removes a killed writer's temporaries);
    not tied to a thread: the farm releases it on a callback thread."""

    #: the lock files this process holds -> whether its holder completed the entry of a remote cache's copy, so owes
    #: its upload when it releases the lock (a dict's set and pop are atomic)
    _held: ClassVar[dict[Path, bool]] = {}

    def __init__(self, entry: CacheEntry) -> None:
        self.path = entry.lock_path
        self.entry = entry
        self._lock = FileLock(self.path, thread_local=False)

    def acquire(self, timeout: float = 0) -> bool:
        """Take the lock within ``timeout`` seconds (0: one try); False when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=timeout, poll_interval=0.05)
        except Timeout:
            return False
        _write_pid(self.path, os.getpid())
        KeyLock._held[self.path] = False
        for name in remove_temporaries(self.entry.path):
            log.info("removed %s from cache entry %s: a write killed before it finished left it", name,
                     self.entry.key)
        return True

    def release(self) -> None:
        if self._lock.is_locked:
            _write_pid(self.path, None)
            owed = KeyLock._held.pop(self.path, False)
            self._lock.release()
            if owed:  # outside the lock
                remote_cache.publish(self.entry, self.entry.graph_type)


def _lock_holder(entry: CacheEntry, graph_type: str | None, pid: int | None) -> tuple[str, str]:
    """``the lock ... of cache entry ... (graph type ...)`` and who holds it."""
    return (f"the lock {entry.lock_path} of cache entry {entry.key} (graph type "
            f"{graph_type or entry.graph_type!r})", f"process {pid}" if pid else "another process")


def _lock_waiting(entry: CacheEntry, graph_type: str | None, pid: int, waited: float, timeout: float) -> str:
    """What a wait for another process's key lock waits for (it may take hours), so a blocked job is never silent."""
    lock, holder = _lock_holder(entry, graph_type, pid)
    stop = f"stop it (`kill {pid}` on the machine running it)" if pid else "stop it"
    return (f"waiting for {lock}: {holder} holds it while it builds that entry (waited {waited:.0f} s, gives up after "
            f"{timeout:.0f} s); this run uses the entry once it is built (or builds it itself if that process dies "
            f"first).\nfix: if {holder} is stuck, {stop}: its lock is released when it exits and this run goes on "
            f"(`neuron-args cache ls {shlex.quote(str(entry.root))}` shows the entry as compiling).")


def disk_error(exc: OSError, where: Path, *, key: str, graph_type: str | None, corrupt: str | None = None) -> CompileError:
    """A file-system failure while writing an entry (or moving a ``corrupt`` one aside), as the error a user can act on."""
    elsewhere = f"point the cache elsewhere (options['cache_dir'] or ${CACHE_DIR_ENV})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on the file system of {where} or {elsewhere}"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {where} writable or {elsewhere}"
    elif exc.errno == errno.EFBIG:  # a file-size limit (RLIMIT_FSIZE: `ulimit -f`), or the file system's own
        fix = f"raise the job's file-size limit (`ulimit -f`) or {elsewhere}"
    elif exc.errno in (errno.EISDIR, errno.ENOTDIR) and exc.filename:  # e.g. a folder at the lock file's place
        fix = f"remove {shlex.quote(os.fsdecode(exc.filename))} (it is in the way of the cache's own file) or {elsewhere}"
    else:
        fix = f"check the file system of {where}"
    what = (f"cache entry {key} ({graph_label(graph_type)}) in {where} is corrupt ({corrupt}) and cannot be moved "
            "aside to be rebuilt" if corrupt else f"cannot write cache entry {key} ({graph_label(graph_type)}) in {where}")
    after = ("It is never loaded; a run that can write the cache moves it aside and rebuilds it." if corrupt else
             "The entry is left incomplete and is rebuilt by the next run.")
    return CompileError(
        f"{what}: {exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, exc.errno)}). {after}\nfix: {fix}")


def new_metadata(
    key: CacheKey, *, seam: str, graph_type: str | None, compiler_args: Sequence[str] | None, target: str, **extra: Any
) -> EntryMetadata:
    return EntryMetadata.parse({
        "metadata_version": METADATA_VERSION,
        "key": key.key,
        "seam": seam,
        "graph_type": graph_type,
        "compiler_args": None if compiler_args is None else list(compiler_args),
        "target": target,
        "key_components": key.components.as_dict(),
        "created": now_iso(),
        **extra,
    }, key.key)


def warn_if_shared(root: Path) -> str | None:
    """Warn once per root (as pip does) when others may write it and signing is off: they choose what runs here."""
    if signing_key() is not None or not hasattr(os, "getuid"):
        return None
    try:
        st = root.stat()
    except OSError:
        return None
    owner = st.st_uid != os.getuid()
    if not owner and not st.st_mode & stat.S_IWOTH or not ACTIVITY.say_once(f"shared cache {root}"):
        return None  # a group-writable team cache (umask 002) is a choice
    who = (f"owned by user id {st.st_uid}, not by this user ({os.getuid()})" if owner else
           f"writable by every user (mode {stat.filemode(st.st_mode)})")
    message = (f"compile cache {root} is {who}: whoever can write it chooses the executables this process loads "
               f"(see README 'Sharing a cache safely'). Fix: use a cache only you write, or set {SIGNING_KEY_ENV} "
               "to load only entries signed with your key; silence with "
               "logging.getLogger('neuron_args.cache.trust').setLevel(logging.ERROR)")
    logging.getLogger("neuron_args.cache.trust").warning("%s", message)
    return message


class CompileCache:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = cache_root(root) if remote_cache.is_remote(root) else Path(root).expanduser().resolve()

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None) -> CompileCache:
        return cls.from_settings(CompileSettings.from_options(options, "CompileCache.from_options"))

    @classmethod
    def from_settings(cls, settings: CompileSettings) -> CompileCache:
        return cls(cache_root(settings.cache_dir))

    def entry(self, key: CacheKey | str) -> CacheEntry:
        return CacheEntry(self.root, str(key))

    @property
    def trace_memo_dir(self) -> Path:
        return self.root / TRACE_MEMO_DIR

    def entries(self) -> list[CacheEntry]:
        """Every entry folder (named by a key: no lock file or dot folder), sorted by key."""
        try:
            with os.scandir(self.root) as items:
                names = sorted(i.name for i in items if is_cache_key(i.name) and i.is_dir())
        except OSError:
            return []
        return [CacheEntry(self.root, name) for name in names]

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry of ``key`` when it is a key (a name from a manifest cannot point outside the cache)."""
        return CacheEntry(self.root, key) if is_cache_key(key) else None

    def find(self, prefix: str, *, remote: remote_cache.S3Store | None = None) -> CacheEntry:
        """The one entry whose key starts with ``prefix`` (here, or in the ``remote`` this folder copies); else a
        KeyError naming the candidates."""
        wanted = prefix.strip().lower()
        if not wanted or not all(c in "0123456789abcdef" for c in wanted):
            raise KeyError(f"{prefix!r} is not a cache key or key prefix (hex characters)")
        keys = {e.key for e in self.entries()} | {k for k, _ in (() if remote is None else remote.markers())}
        matches = sorted(k for k in keys if k.startswith(wanted))
        if not matches:
            raise KeyError(f"no cache entry in {self.root} has a key starting with {prefix!r}")
        if len(matches) > 1:
            where = self.root if remote is None else f"{remote.loc.url} and its local copy"
            shown = ", ".join(matches[:5]) + (" ..." if len(matches) > 5 else "")
            raise KeyError(f"key prefix {prefix!r} is ambiguous in {where}: {len(matches)} entries "
                           f"({shown}); give more characters")
        return self.entry(matches[0])

    def check_root(self) -> None:
        """Raise :class:`OptionsError` when the root cannot be a directory; warn once when others may write it."""
        problem = directory_problem(self.root)
        if problem is not None:
            in_way = "" if problem.startswith("cannot") else ", or remove the file in its way"
            raise OptionsError(f"cache_dir {self.root} {problem}; pass a directory as options['cache_dir'] "
                               f"(or ${CACHE_DIR_ENV}) that this user can create{in_way}")
        warn_if_shared(self.root)

    @contextlib.contextmanager
    def lock(self, key: CacheKey | str, *, stop: Callable[[float], bool] | None = None,
             timeout: float = LOCK_TIMEOUT, graph_type: str | None = None) -> Iterator[None]:
        """Exclusive per-key lock across processes (released when the holder dies, too); ``stop(seconds)``,
        polled, makes the wait interruptible (``InterruptedError``), and one past ``timeout`` is a :class:`CompileError`."""
        entry = self.entry(key)
        key_lock = KeyLock(entry)
        if not key_lock.acquire(0):
            started = time.monotonic()
            due = started + LOCK_NOTICE_AFTER
            while not key_lock.acquire(0 if stop is not None else _LOCK_POLL):
                now = time.monotonic()
                if now >= started + timeout:
                    lock, holder = _lock_holder(entry, graph_type, entry.lock_pid())
                    raise CompileError(
                        f"waited {timeout:.0f} s for {lock}: {holder} has been building it all that time.\nfix: if "
                        f"{holder} is stuck, stop it (the lock is released when it exits) and run again; a build that "
                        "legitimately takes longer needs a longer compile timeout.")
                if now >= due:  # logged every LOCK_NOTICE_REPEAT while another process holds it
                    due = now + LOCK_NOTICE_REPEAT
                    pid = entry.lock_pid()
                    if pid is not None:
                        log.warning("%s", _lock_waiting(entry, graph_type, pid, now - started, timeout))
                if stop is not None and stop(_LOCK_POLL):
                    raise InterruptedError(f"stopped waiting for the lock of {key}")
        try:
            yield
        finally:
            key_lock.release()

    def pull(self, entry: CacheEntry, graph_type: str | None = None) -> bool:
        """Copy ``entry`` from the remote cache this folder copies, if any and if there."""
        return remote_cache.pull(entry, lock=lambda: self.lock(entry.key, graph_type=graph_type), graph_type=graph_type)

    def verified(self, entry: CacheEntry) -> str | None:
        """:meth:`CacheEntry.problem`, once per process and entry (the bytes hashed kept on ``entry`` for its load)."""
        ident = (str(self.root), entry.key)
        if ident in _verified:
            return None
        problem = entry.problem(keep=True)
        if problem is None:
            _verified.add(ident)
        return problem

    def quarantine(self, entry: CacheEntry, reason: str) -> Path | None:
        """Move a corrupt entry to ``<root>/.corrupt/<key>-<time>-<pid>`` so it is rebuilt (None: replaced meanwhile)."""
        seen = file_stamp(entry.marker_path)
        with self.lock(entry.key):
            if not entry.path.exists() or file_stamp(entry.marker_path) != seen:  # rebuilt by another process
                return None
            dest = self.root / QUARANTINE_DIR / f"{entry.key}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            if dest.parent.is_symlink() or dest.parent.is_file():  # not ours to keep: it would block every rebuild
                log.warning("%s is not a folder; removed it to move corrupt cache entries aside there", dest.parent)
                dest.parent.unlink()
            dest.parent.mkdir(parents=True, exist_ok=True)
            for n in range(1, 1000):  # the same second twice (a clock set back): never onto an earlier copy
                if not dest.exists():
                    break
                dest = dest.with_name(f"{dest.name.split('~')[0]}~{n}")
            os.replace(entry.path, dest)
        _verified.discard((str(self.root), entry.key))
        _corrupt[entry.key] = reason
        log.warning("compile cache entry %s was corrupt (%s); moved it to %s and it will be rebuilt",
                    entry.key, reason, dest)
        return dest

    def get_or_build(
        self,
        key: CacheKey,
        build: Callable[[CacheEntry], None],
        *,
        graph_type: str | None = None,
        on_hit: Callable[[CacheEntry], None] | None = None,
    ) -> tuple[CacheEntry, bool]:
        """``(entry, hit)``; on a miss run ``build`` (it fills a fresh entry folder) under the key's lock. A corrupt
        entry is moved aside and rebuilt; a miss under ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` raises
        :class:`CacheMissError`. ``on_hit(entry)`` runs before any hit is taken (it may raise)."""
        entry = self.entry(key)

        def hit() -> tuple[CacheEntry, bool]:
            if on_hit is not None:
                on_hit(entry)
            count("hits")
            return entry, True

        if not entry.is_complete:
            self.pull(entry, graph_type)
        complete = entry.is_complete  # read once: only what was verified is a hit
        problem = self.verified(entry) if complete else None
        if complete and problem is None:
            return hit()
        if assert_cache_hit_enabled():
            count("misses")
            raise (self.miss_error(key, graph_type) if problem is None else
                   self.corrupt_error(entry, problem, graph_type))
        if problem is not None:
            try:
                self.quarantine(entry, problem)
            except OSError as exc:  # a read-only or full cache: its lock file or the move
                raise disk_error(exc, self.root, key=key.key, graph_type=graph_type, corrupt=problem) from exc
        try:
            with self.lock(key, graph_type=graph_type):
                if entry.is_complete and self.verified(entry) is None:  # another process built it while we waited
                    return hit()
                count("misses")
                try:
                    entry.reset()
                    build(entry)
                    entry.mark_complete()
                except (CompileError, KeyboardInterrupt) as exc:
                    entry.record_unfinished(exc)
                    raise
                _verified.add((str(self.root), entry.key))
                count("compiles")
        except OSError as exc:  # the lock, the entry folder or a file in it: a full or read-only disk
            raise disk_error(exc, entry.path, key=key.key, graph_type=graph_type) from exc
        return entry, False

    def corrupt_error(self, entry: CacheEntry, problem: str, graph_type: str | None) -> CacheMissError:
        return CacheMissError(
            f"cache entry {entry.key} ({graph_label(graph_type)}) in {self.root} is corrupt: {problem}; "
            f"while {ASSERT_CACHE_HIT_ENV} is set it would be rebuilt at serve time.\n"
            f"  fix: run the warmup again without {ASSERT_CACHE_HIT_ENV} (it moves the corrupt entry aside "
            f"and rebuilds it), or delete {entry.path}; `neuron-args cache verify {shlex.quote(str(self.root))}` "
            "lists every corrupt entry.")

    def closest(self, key: CacheKey, graph_type: str | None = None
                ) -> tuple[CacheEntry, EntryMetadata, list[str]] | None:
        """The complete entry most like ``key``: same graph, same graph type, fewest differences, warmed by the runner
        now serving (a shared cache holds other runs' variants), then key order."""
        target = key.components.as_dict()
        serving = ACTIVITY.serving  # the keys it warmed up (none open: every key this process loaded or built)
        warmed_here = (set(ACTIVITY.loaded) | set(ACTIVITY.records) if serving is None else
                       {g.key for graphs in serving.warmed.values() for g in graphs})
        ranked: list[tuple[tuple[int, int, int, int, str], CacheEntry, EntryMetadata, list[str]]] = []
        for entry in self.entries():
            if entry.key == key.key or not entry.is_complete:
                continue
            try:
                md = entry.info()
            except CorruptEntryError:
                continue
            comps = md.key_components
            if comps is None:
                continue
            diff = explain_components(comps, target)
            ranked.append(((
                0 if comps.get("graph") == target["graph"] else 1,
                0 if graph_type is not None and md.graph_type == graph_type else 1,
                len(diff),
                0 if entry.key in warmed_here else 1,
                entry.key,  # unique: two scores never tie, so entries are never compared
            ), entry, md, diff))
        return None if not ranked else min(ranked)[1:]

    def miss_error(self, key: CacheKey, graph_type: str | None) -> CacheMissError:
        """Explain a miss: the graph, the key, the closest entry and what differs, and the fix."""
        lines = [
            f"cache miss for {graph_label(graph_type)} (key {key.key}) in {self.root} "
            f"while {ASSERT_CACHE_HIT_ENV} is set: this graph would compile at serve time."
        ]
        if key.key in _corrupt:
            lines.append(f"  its entry was corrupt ({_corrupt[key.key]}) and was moved to {self.root / QUARANTINE_DIR}.")
        near = self.closest(key, graph_type)
        diff: list[str] = []
        if near is None:
            lines.append("  no warmed-up entry resembles it: the cache holds no complete entry for this graph.")
        else:
            entry, md, diff = near
            lines.append(f"  closest warmed-up entry: {entry.key} (graph type {md.graph_type!r}); it differs in:")
            lines += [f"    {d}" for d in diff] or ["    nothing but the key"]
        label = repr(graph_type) if graph_type is not None else "<graph type>"
        if any(d.startswith("compiler_args") for d in diff):
            lines.append(
                f"  fix: run this call inside scoped_compiler_args(resolve_graph_compiler_args({label})) so it "
                "resolves the same arguments as warmup (or make the policy deterministic).")
        casts = [] if near is None else _dtype_changes(near[1].key_components, key)
        if casts:
            lines.append(f"  fix: pass inputs of the dtypes warmed up ({'; '.join(casts)}), "
                         f"or declare a bucket with these dtypes for {label} and warm it up.")
        elif any(d.startswith("input_specs") for d in diff) or not diff:
            lines.append(f"  fix: warm this graph type and shape up before serving (declare the bucket for {label}).")
        if any(d.startswith(("target", "tool_versions")) for d in diff):
            lines.append("  fix: warm up with the same target, compiler and tool versions as serve.")
        return CacheMissError("\n".join(lines))


def _dtype_changes(warmed: Any, key: CacheKey) -> list[str]:
    """``["input 2 is float64, warmed up as float32: .to(torch.float32)"]`` when only dtypes differ: a cast fixes it."""
    before = warmed.get("input_specs") if isinstance(warmed, dict) else None
    after = key.components.as_dict().get("input_specs")
    if not isinstance(before, list) or not isinstance(after, list) or len(before) != len(after):
        return []
    changes = []
    for i, (old, new) in enumerate(zip(before, after)):
        if not (isinstance(old, dict) and isinstance(new, dict)) or old.get("shape") != new.get("shape"):
            return []
        if old.get("dtype") != new.get("dtype"):
            changes.append(f"input {i} is {new.get('dtype')}, warmed up as {old.get('dtype')}: "
                           f".to(torch.{old.get('dtype')})")
    return changes


def _assert_cache_key_args(
    entry: CacheEntry, compiler_args: CompilerArgs | Sequence[str] | None, *, graph_type: str | None = None
) -> None:
    """Native seam guard: its key leaves the arguments out, so one key must never get two sets (across processes:
    the first set is in the metadata)."""
    if not entry.is_complete:
        return
    try:
        recorded = entry.info().compiler_args
    except CorruptEntryError:  # not loaded: the cache moves it aside and rebuilds it
        return
    if recorded is None:
        return
    requested = CompilerArgs.of(compiler_args)
    if recorded.canonical != requested.canonical:  # the recorded list was read back as CompilerArgs by info()
        raise CacheKeyArgsConflict(
            f"cache key {entry.key} ({graph_label(graph_type)}) was compiled with\n"
            f"    {list(recorded)}\n  and is now requested with\n    {requested.argv}\n"
            "  The native cache keys on graph structure and I/O shapes, not on compiler flags, so one NEFF "
            "cannot serve both. Give the graph one argument set (a deterministic policy, the same scope at "
            "warmup and serve), or use the neuron_libtorch backend, whose key includes the arguments."
        )
