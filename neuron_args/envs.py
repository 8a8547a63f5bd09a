"""Every environment variable neuron-args reads or writes, one :class:`EnvVar` row each (the vLLM ``envs.py``
idea): read through :func:`flag`, :func:`text`, :func:`seconds`, :func:`count`; an undeclared name is a ``KeyError``."""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from neuron_args.errors import OptionsError

# pytest's own bool ini words too (y, t, n, f), so an ini switch given the way pytest reads one keeps working.
TRUE_VALUES = ("1", "true", "yes", "on", "y", "t")
FALSE_VALUES = ("0", "false", "no", "off", "n", "f")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: ``kind`` is ``bool`` (read with :func:`flag`) or what its text holds."""

    name: str
    kind: str
    default: Any
    doc: str
    secret: bool = False  # never logged or shown with its value
    documented: bool = True  # in README's table; False: set by another tool (torchrun, GitHub Actions, XDG)


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("NEURON_LIBTORCH_ASSERT_CACHE_HIT", "bool", False,
           "true value: a cache miss raises `CacheMissError` instead of compiling (the default; `NeuronRunner.serve()` "
           "asserts for its block without setting it, `serve(assert_cache_hit=False)` leaves it to this variable; a "
           "runner's warmup compiles regardless: the variable asserts after warmup, and the pytest summary says how "
           "many graphs the warmups compiled under it; to fail on a cold cache, assert `with "
           "neuron_compile_counter.expect(compiles=0): neuron_runner.warmup()`); a true value also makes Dynamo's "
           "recompile limit an error (see `NEURON_ARGS_EAGER_FALLBACK`)"),
    EnvVar("NEURON_LIBTORCH_CACHE_DIR", "path", None,
           "compile-cache root (else `options[\"cache_dir\"]`, else `$XDG_CACHE_HOME/neuron-args/compile-cache` when "
           "that is an absolute path, else `~/.cache/neuron-args/compile-cache`; no home directory at all is an "
           "`OptionsError` saying what to set)"),
    EnvVar("NEURON_ARGS_REMOTE_CACHE_COPY", "path", None,
           "folder of the local read-through copies of `s3://` caches: `<folder>/<bucket>/<prefix>` (default "
           "`~/.cache/neuron-args/remote`, under `$XDG_CACHE_HOME` when set); see Sharing a cache across hosts"),
    EnvVar("NEURON_ARGS_REMOTE_CACHE_TIMEOUT", "seconds", 20.0,
           "connect and read timeout of the S3 client of an `s3://` cache (retries: the AWS standard mode, "
           "`AWS_MAX_ATTEMPTS`); an endpoint that does not answer in time makes the process go on local-only, warned"),
    EnvVar("NEURON_ARGS_CACHE_SIGNING_KEY", "text", None,
           "HMAC key for a signed cache: entries written are signed (HMAC-SHA256) and entries not signed with it are "
           "never loaded; see Sharing a cache safely (a secret: never logged)", secret=True),
    EnvVar("VLLM_NEURON_MANIFEST_DIR", "path", None,
           "enables the ledger and manifests under this directory; unset or empty: nothing is written"),
    EnvVar("NEURON_VISIBLE_DEVICES", "text", None,
           "the engine's core window: `dev{first}_{last}` names its manifest (`nodev` when unset)"),
    EnvVar("NEURON_RT_VISIBLE_CORES", "text", None,
           "the Neuron runtime's cores; set from this rank's share of `NEURON_VISIBLE_DEVICES` (an explicit value "
           "naming other cores is an error)"),
    EnvVar("NEURON_CC_FLAGS", "text", None,
           "base compiler args when the compile options give none (split shell-style); an option given twice with "
           "different values (`-O1 -O3`) compiles with the last, as neuronx-cc does, and is one `CompilerArgsWarning` "
           "naming both values"),
    EnvVar("NEURON_ARGS_COMPILER", "text", "auto",
           "`local`, `neuronx-cc` or `auto` (default: neuronx-cc when on PATH, else local); in a pytest session "
           "without `--neuron-compiler` or its ini key, another value, or `neuronx-cc` not on PATH, is a usage error "
           "at start-up"),
    EnvVar("NEURON_ARGS_TARGET", "text", "trn2",
           "compile target when none is given by `--neuron-target` or its ini key, `NeuronRunner(target=)`, "
           "`options[\"target\"]` or `--target` in the compiler args (an unknown target is a `CompilerArgsError` "
           "naming the variable and the known targets)"),
    EnvVar("NEURON_ARGS_ALLOW_EAGER_OUTPUTS", "bool", False,
           "true value: NEFFs with no torch-neuronx runtime binding take eager outputs instead of failing"),
    EnvVar("NEURON_ARGS_EAGER_FALLBACK", "text", None,
           "`error` or `warn`: what a frame compiled by a neuron backend does when Dynamo's recompile limit stops "
           "compiling it (it would run in eager PyTorch); default `error` under the pytest plugin, with "
           "`NEURON_LIBTORCH_ASSERT_CACHE_HIT` or in a `NeuronRunner` call, else `warn`"),
    EnvVar("NEURON_ARGS_TRACE_WORKERS", "count", None, "parallel trace worker count (default: the CPU count)"),
    EnvVar("NEURON_ARGS_COMPILE_WORKERS", "count", None, "parallel compile worker count (default: the CPU count)"),
    EnvVar("NEURON_ARGS_COMPILE_TIMEOUT", "seconds", None,
           "seconds a compile may run when `options[\"compile_timeout\"]` is not given (defaults: neuronx-cc 7200, "
           "local 1800)"),
    EnvVar("NEURON_ARGS_WARM_WORKERS", "bool", True,
           "false value: the local compiler starts one process per graph (default: warm worker processes that start "
           "their XLA:CPU client once, one per concurrent compile)"),
    EnvVar("NEURON_ARGS_WARM_WORKER_IDLE", "seconds", 300.0, "seconds an idle warm worker stays before it exits"),
    EnvVar("NEURON_ARGS_TRACE_IDLE_SECONDS", "seconds", 30.0,
           "seconds a runner's idle trace children wait for its next parallel warmup before they exit (0 keeps none)"),
    EnvVar("NEURON_ARGS_FAST_PATH", "bool", True,
           "false value: serve every runner call through `torch.compile`'s guarded path (default: warmed calls take "
           "the fast path)"),
    EnvVar("NEURON_ARGS_DIRECT_CALL", "bool", True,
           "false value: every compiled graph keeps aot_autograd's runtime wrapper (default: inference graphs that "
           "only copy mutated inputs back are called directly)"),
    EnvVar("NEURON_ARGS_TRACE_MEMO", "bool", True,
           "false value: trace every graph in full (default: a re-trace whose memoized key is built skips "
           "aot_autograd and the lowering; memo in `<cache>/.trace-memo/`)"),
    EnvVar("NEURON_ARGS_GC_FREEZE", "bool", True,
           "false value: the pytest plugin leaves Python's collector alone (default: after collection, after a shared "
           "runner's warmup and at session end it collects once and freezes the heap, so later full collections skip "
           "it; see docs/ARCHITECTURE.md)"),
    EnvVar("NEURON_ARGS_XLA_CPU_ASYNC", "bool", False,
           "true value: run local executables on jax's asynchronous XLA:CPU client instead of the synchronous one"),
    EnvVar("NEURON_ARGS_ENGINE", "index", 0, "this process's engine index (set by `neuron_args.launch`)"),
    EnvVar("NEURON_ARGS_DP", "count", 1, "how many engines run side by side (set by `neuron_args.launch`)"),
    EnvVar("RANK", "index", 0, "tensor-parallel rank (torchrun, `neuron_args.launch`)", documented=False),
    EnvVar("WORLD_SIZE", "count", 1, "tensor-parallel world size (torchrun, `neuron_args.launch`)", documented=False),
    EnvVar("LOCAL_RANK", "index", None, "rank within this host (torchrun)", documented=False),
    EnvVar("LOCAL_WORLD_SIZE", "count", None, "ranks on this host (torchrun)", documented=False),
    EnvVar("TORCH_TRACE", "path", None, "torch's structured trace folder: the plugin keeps its trace log on",
           documented=False),
    EnvVar("GITHUB_STEP_SUMMARY", "path", None, "GitHub Actions' step summary file the plugin appends to",
           documented=False),
    EnvVar("XDG_CACHE_HOME", "path", None, "per-user cache root for the default compile cache", documented=False),
)
_BY_NAME = {v.name: v for v in VARIABLES}
BOOLEAN_HELP = f"one of {', '.join(TRUE_VALUES)} (true) or {', '.join(FALSE_VALUES)} (false)"


def variable(name: str) -> EnvVar:
    """The table's row for ``name``; a name not in the table is a ``KeyError`` (declare it here)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in neuron_args/envs.py") from None


def parse_bool(name: str, raw: str | None, default: bool) -> bool:
    """The one boolean parser: unset or empty gives ``default``; an unknown value is an OptionsError."""
    value = (raw or "").strip().lower()
    if not value:
        return default
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    shown = "<secret>" if variable(name).secret else repr(raw)
    raise OptionsError(f"{name}={shown} is not a boolean: give {BOOLEAN_HELP}, or unset it "
                       f"(default: {'true' if default else 'false'})")


def flag(name: str) -> bool:
    """A boolean variable's value (its default when unset or empty)."""
    var = variable(name)
    if var.kind != "bool":
        raise TypeError(f"{name} is a {var.kind} variable, not a bool")
    return parse_bool(name, os.environ.get(name), var.default)


def text(name: str) -> str:
    """A declared variable's value, stripped; ``""`` when unset."""
    variable(name)
    return os.environ.get(name, "").strip()


def as_seconds(value: object, *, zero_ok: bool = False) -> float | None:
    """``value`` (a number or its text) as finite positive seconds (zero too when ``zero_ok``); None if it is not:
    the one rule for every timeout a variable, an option or a command line gives."""
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and (seconds > 0 or (zero_ok and seconds == 0)) else None


def checked_seconds(value: object, source: str, *, zero_ok: bool = False, what: str = "a number of seconds",
                    fix: str = "") -> float:
    """``value`` as :func:`as_seconds` reads it, else an :class:`OptionsError` naming ``source`` and ``fix``."""
    seconds = as_seconds(value, zero_ok=zero_ok)
    if seconds is None:
        raise OptionsError(f"{source}={value!r} is not {what}: give a {'non-negative' if zero_ok else 'positive'} "
                           f"number{fix}")
    return seconds


def seconds(name: str, *, zero_ok: bool = False, hint: str = "") -> float:
    """A ``seconds`` variable: a finite positive number (zero too when ``zero_ok``), else its default."""
    var = variable(name)
    default = "" if var.default is None else f" (default {var.default:g})"
    raw = text(name)
    return checked_seconds(raw, name, zero_ok=zero_ok, fix=f"{hint}, or unset it{default}") if raw else var.default


def count(name: str, *, hint: str = "") -> int | None:
    """A ``count`` variable: a positive integer (an ``index`` variable: zero too), else its default."""
    var = variable(name)
    raw = text(name)
    if not raw:
        return var.default
    least = 0 if var.kind == "index" else 1
    if not raw.isascii() or not raw.isdigit() or int(raw) < least:
        what = "a non-negative integer" if least == 0 else "a positive integer"
        raise OptionsError(f"{name}={raw!r} is not {'an index' if least == 0 else 'a count'}: give {what}, or unset "
                           f"it{hint}")
    return int(raw)


def is_set(name: str) -> bool:
    """Whether a declared variable holds a non-blank value."""
    return bool(text(name))


def __getattr__(name: str) -> Any:  # envs.NEURON_ARGS_FAST_PATH -> bool, envs.NEURON_CC_FLAGS -> str
    if name in _BY_NAME:
        return _READERS.get(_BY_NAME[name].kind, text)(name)
    raise AttributeError(name)


_READERS: dict[str, Any] = {"bool": flag, "seconds": seconds, "count": count, "index": count}


def markdown_table() -> str:
    """README's "Environment variables" table: the documented rows, in table order."""
    rows = ["| variable | type | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.kind} | {v.doc} |" for v in VARIABLES if v.documented]
    return "\n".join(rows)


# -- writes: this process's environment and the environments of the children it starts -------------

def environ() -> MutableMapping[str, str]:
    """This process's environment, for APIs that take an environment mapping (default argument)."""
    return os.environ


def snapshot(prefixes: tuple[str, ...] | None = None) -> dict[str, str]:
    """A copy of this process's environment (only names starting with ``prefixes`` when given)."""
    return {k: v for k, v in os.environ.items() if prefixes is None or k.startswith(prefixes)}


def put(name: str, value: str | None) -> None:
    """Set ``name`` in this process's environment; None removes it."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def replace(env: Mapping[str, str]) -> None:
    """Make this process's environment exactly ``env`` (a forked child taking its parent's)."""
    os.environ.clear()
    os.environ.update(env)


@contextlib.contextmanager
def overridden(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set ``values`` (None: unset) for the block, then put back what was there."""
    old = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            put(name, value)
        yield
    finally:
        for name, value in old.items():
            put(name, value)
