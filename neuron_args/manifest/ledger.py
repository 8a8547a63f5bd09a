"""The compile-time ledger: each process appends one JSONL line per captured graph to
``<root>/ledger/<engine-id>/<pid>.jsonl``, which the emitter (local rank 0, after warmup) reads.

A line is a raw ``os.write`` on an ``O_APPEND`` descriptor opened per line (it survives a fork child's
``os._exit()``); one file per process needs no lock, and a process's first write truncates an earlier run's
file. Best-effort: a failure is logged once and swallowed, since the manifest must never break a compile.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from neuron_args.activity import ACTIVITY
from neuron_args.atomic import open_for_writing
from neuron_args.cache_key import KEY_LENGTH, is_cache_key
from neuron_args.manifest.engine import VISIBLE_DEVICES_ENV, get_server_prefix, manifest_root_str
from neuron_args.untrusted import LEDGER_LIMIT, load_json, read_bounded

__all__ = [
    "LEDGER_DIRNAME",
    "Ledger",
    "LedgerGraph",
    "clear_tp_group",
    "current_tp_rank",
    "ledger_dir",
    "ledger_engines",
    "rank_mapper",
    "read_ledger",
    "record_graph",
    "register_tp_group",
    "shape_string",
]

logger = logging.getLogger("neuron_args.manifest")

LEDGER_DIRNAME = "ledger"
_ENCODER = json.JSONEncoder(separators=(",", ":"))

# Process state is ACTIVITY.ledger (keyed by pid, so a forked child starts its files clean).
_lock = threading.Lock()


def _reinit_lock_in_child() -> None:
    # A fork taken while another thread held the lock would leave it held forever in the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_lock_in_child)


def register_tp_group(group_ranks: Sequence[int], rank_in_group: int) -> None:
    """Ledger lines record ``rank_in_group`` (vLLM's ``get_tp_group().rank_in_group``); the emitter maps it back
    to ``group_ranks[rank_in_group]``. Forked children inherit it."""
    if isinstance(group_ranks, (str, bytes)) or not isinstance(group_ranks, Sequence):
        raise TypeError(
            f"register_tp_group: group_ranks must be a sequence of global ranks, got {group_ranks!r}"
        )
    ranks = tuple(int(r) for r in group_ranks)
    if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise ValueError(
            f"register_tp_group: group_ranks {list(group_ranks)!r} must be non-empty, unique, "
            "non-negative global ranks"
        )
    if isinstance(rank_in_group, bool) or not isinstance(rank_in_group, int) or rank_in_group not in range(len(ranks)):
        raise ValueError(
            f"register_tp_group: rank_in_group {rank_in_group!r} is not an index into "
            f"group_ranks {list(ranks)!r} (expected 0..{len(ranks) - 1})"
        )
    ACTIVITY.ledger.tp_group = (ranks, rank_in_group)


def clear_tp_group() -> None:
    """Forget a registered TP group (e.g. when a runner tears its engine down)."""
    ACTIVITY.ledger.tp_group = None


def _torch_dist():
    """``torch.distributed`` when torch is already imported and a default group exists."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # a broken torch install must not break the ledger
        return None


def current_tp_rank() -> int:
    """This writer's TP-local rank: registered, else the default group's rank, else 0."""
    group = ACTIVITY.ledger.tp_group
    if group is not None:
        return group[1]
    dist = _torch_dist()
    try:
        return 0 if dist is None else int(dist.get_rank())
    except Exception:  # a broken torch install must not break the ledger
        return 0


def _by_index(group: Sequence[int]) -> Callable[[int], int | None]:
    return lambda local: group[local] if 0 <= local < len(group) else None


def rank_mapper(rank_map: Mapping[int, int] | Sequence[int] | None = None) -> Callable[[int], int | None]:
    """TP-local rank (as a ledger line records it) -> global rank (None: not covered), from ``rank_map``, else
    the registered TP group, else torch.distributed's default group, else identity."""
    if isinstance(rank_map, Mapping):
        return {int(k): int(v) for k, v in rank_map.items()}.get
    if rank_map is not None:
        return _by_index([int(r) for r in rank_map])
    registered = ACTIVITY.ledger.tp_group
    if registered is not None:
        return _by_index(registered[0])
    dist = _torch_dist()
    if dist is not None:
        try:
            return _by_index(list(dist.get_process_group_ranks(dist.group.WORLD)))
        except Exception as exc:
            logger.debug("manifest: torch.distributed group ranks unavailable: %s", exc)
    return lambda local: local


def shape_string(shape: object) -> str:
    """A shape in the manifest's Python-tuple string form: ``(4,)`` -> ``"4,"``, ``(4, 16)`` -> ``"4, 16"``."""
    if isinstance(shape, str):
        return shape
    dims = [str(int(d)) for d in shape]  # type: ignore[union-attr]
    return dims[0] + "," if len(dims) == 1 else ", ".join(dims)


def _encode(
    key: str,
    rank: int,
    input_shapes: Sequence[object],
    compiler_flags: str | Sequence[str],
    graph_type: str | None,
) -> bytes:
    if isinstance(input_shapes, str):  # one shape given bare, not a list of characters
        input_shapes = [input_shapes]
    flags = compiler_flags if isinstance(compiler_flags, str) else [str(t) for t in compiler_flags]
    record: dict[str, object] = {
        "key": str(key),
        "rank": rank,
        "input_shapes": [shape_string(s) for s in input_shapes],
        "compiler_flags": flags,
    }
    if graph_type is not None:
        record["graph_type"] = str(graph_type)
    return (_ENCODER.encode(record) + "\n").encode()


def ledger_dir(root: os.PathLike[str] | str, engine_id: str) -> str:
    """``<root>/ledger/<engine-id>``."""
    return os.path.join(os.fspath(root), LEDGER_DIRNAME, engine_id)


def _append(path: str, data: bytes) -> None:
    state = ACTIVITY.ledger
    with _lock:
        pid = os.getpid()
        if state.pid != pid:  # first call in this process (or in a forked child)
            state.pid = pid
            state.started_paths.clear()
            state.torn_paths.clear()
        first = path not in state.started_paths
        try:
            fd = open_for_writing(path, append=not first)  # a link planted at <pid>.jsonl is replaced, not followed
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = open_for_writing(path, append=not first)
        state.started_paths.add(path)
        if path in state.torn_paths and not first:  # end the torn fragment: it must not swallow this line
            data = b"\n" + data
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            if len(view) < len(data):  # a part of the line is on disk: the next line starts a new one
                state.torn_paths.add(path)
            raise
        else:
            state.torn_paths.discard(path)
        finally:
            os.close(fd)


_FIX_DIR = "Check that VLLM_NEURON_MANIFEST_DIR points to a writable directory, or unset it to turn the manifest off."


def _log_failure_once(path: str | None, exc: BaseException, fix: str = _FIX_DIR) -> None:
    pid = os.getpid()
    if ACTIVITY.ledger.failure_logged_pid == pid:
        logger.debug("manifest ledger write failed again: %s: %s", type(exc).__name__, exc)
        return
    ACTIVITY.ledger.failure_logged_pid = pid
    where = f" to {path}" if path else ""
    logger.warning(
        "manifest ledger write%s failed (%s: %s); the manifest of this engine will miss graphs "
        "recorded by pid %d. Compilation is unaffected. %s",
        where, type(exc).__name__, exc, pid, fix,
    )


def record_graph(
    *,
    key: str,
    input_shapes: Sequence[str],
    compiler_flags: str | Sequence[str],
    graph_type: str | None = None,
) -> None:
    """Append this process's ledger line for one captured graph (its cache key, input shapes, resolved
    compiler flags); never raises. Off (``VLLM_NEURON_MANIFEST_DIR`` unset/empty): returns at once."""
    root = manifest_root_str()
    if root is None:
        return
    path: str | None = None
    try:
        prefix = get_server_prefix()
    except ValueError as exc:  # a garbage NEURON_VISIBLE_DEVICES: say so, and which variable
        _log_failure_once(None, exc, f"Fix {VISIBLE_DEVICES_ENV} (the engine id is read from it) or unset it.")
        return
    try:
        directory = ledger_dir(root, prefix)
        rank = current_tp_rank()
        if (directory, key, rank) in ACTIVITY.ledger.recorded:  # a Dynamo recompile of a recorded graph adds nothing
            return
        data = _encode(key, rank, input_shapes, compiler_flags, graph_type)
        path = os.path.join(directory, f"{os.getpid()}.jsonl")
        _append(path, data)
        ACTIVITY.ledger.recorded.add((directory, key, rank))
    except Exception as exc:  # best-effort: the manifest never breaks a compile
        _log_failure_once(path, exc)


def forget_recorded(directory: str) -> None:
    """An emit consumed ``directory``: graphs recorded there may be recorded again (a relaunch)."""
    recorded = ACTIVITY.ledger.recorded
    recorded.difference_update([r for r in recorded if r[0] == directory])


@dataclass(slots=True)
class LedgerGraph:
    """One graph of a ledger: the TP-local ranks that recorded it, and the record of the lowest."""

    ranks: set[int]
    record: dict
    rank: int

    @property
    def graph_type(self) -> str | None:
        return self.record.get("graph_type")

    def add(self, rank: int, record: dict | None = None) -> None:
        """Another rank recorded this graph: the lowest rank's record is kept."""
        self.ranks.add(rank)
        if rank < self.rank:
            self.record, self.rank = {**self.record, "rank": rank} if record is None else record, rank


@dataclass
class Ledger:
    """What :func:`read_ledger` found: graphs by key, and the lines it dropped by reason."""

    graphs: dict[str, LedgerGraph] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)


def ledger_engines(root: os.PathLike[str] | str) -> list[str]:
    """The engine ids with a ledger under ``root`` (``<root>/ledger/<engine-id>/``), sorted."""
    try:
        with os.scandir(os.path.join(os.fspath(root), LEDGER_DIRNAME)) as items:
            return sorted(i.name for i in items if i.is_dir())
    except OSError:
        return []

SHAPE_RE = re.compile(r"([0-9]+(, [0-9]+)*,?)?\Z")  # the schema's shape string
_RECORD_START = '{"key":'


def _problem(record: object) -> str | None:
    """Why a decoded ledger record cannot become a manifest graph, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    key = record.get("key")
    if not is_cache_key(key):
        return "key is not 32 lowercase hex characters"
    rank = record.get("rank")
    if "rank" not in record:
        return "no rank"
    if type(rank) is not int or rank < 0:
        return "rank is not a non-negative integer"
    shapes = record.get("input_shapes", [])
    if not isinstance(shapes, list) or not all(isinstance(s, str) and SHAPE_RE.match(s) for s in shapes):
        return "input_shapes is not a list of shape strings"
    flags = record.get("compiler_flags")
    if flags is not None and not isinstance(flags, str) and not (
            isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        return "compiler_flags is not a string or a list of strings"
    if record.get("graph_type") is not None and not isinstance(record["graph_type"], str):
        return "graph_type is not a string"
    return None


def _after_torn(line: str) -> object | None:
    """The record written after a torn fragment on ``line``, else None: :func:`_encode` writes ``{"key":`` only
    at a record's start (a quote in a value is escaped), so it begins at the line's last ``{"key":``."""
    start = line.rfind(_RECORD_START, 1)
    if start == -1:
        return None
    try:
        return load_json(line[start:])
    except ValueError:
        return None


#: Where :func:`_encode` puts a rank's digits: after ``{"key":"<32 hex>","rank":``.
_RANK_AT = len('{"key":"') + KEY_LENGTH + len('","rank":')


def read_ledger(directory: str | os.PathLike[str]) -> Ledger:
    """The graphs of one engine's ledger folder and the dropped lines by reason. The hot loop of an emit: a line
    equal to a checked one but for its rank digits (every rank writes the same line) is a lookup, not a parse."""
    found = Ledger()
    graphs, dropped = found.graphs, found.dropped
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return found
    checked: dict[tuple[str, str], LedgerGraph] = {}  # a checked line's text before and after its rank -> its graph
    for name in names:
        try:
            text = read_bounded(os.path.join(directory, name), LEDGER_LIMIT).decode("utf-8", errors="replace")
        except ValueError:  # not a regular file, or larger than any ledger: a planted file, not a writer's
            dropped["unreadable ledger file (not a regular file or too large)"] += 1
            continue
        for line in text.splitlines():
            end = line.find(",", _RANK_AT)
            slot = (line[:_RANK_AT], line[end:]) if end > _RANK_AT else None
            entry, digits = checked.get(slot), line[_RANK_AT:end]  # type: ignore[arg-type]
            if entry is not None and digits.isascii() and digits.isdigit() and (digits[0] != "0" or len(digits) == 1):
                entry.add(int(digits))  # a rank without a leading zero (as JSON has it)
                continue
            try:
                record, whole = load_json(line), True
            except ValueError:  # too deep a nesting too: one such line loses no other
                if not line.strip():
                    continue
                record, whole = _after_torn(line), False
                dropped["torn or non-JSON"] += 1
                if record is None:
                    continue
            problem = _problem(record)
            if problem is not None:
                dropped[problem] += 1
                continue
            key, rank = record["key"], record["rank"]  # type: ignore[index]
            entry = graphs.setdefault(key, LedgerGraph({rank}, record, rank))  # type: ignore[arg-type]
            entry.add(rank, record)  # type: ignore[arg-type]
            if (whole and slot is not None and digits == str(rank) and slot[0] == f'{{"key":"{key}","rank":'
                    and '"rank":' not in slot[1]):  # in _encode's form: its twins on other ranks are lookups
                checked[slot] = entry
    return found
