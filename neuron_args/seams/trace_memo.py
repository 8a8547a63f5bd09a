"""The trace memo: what a seam's trace of a Dynamo graph produced, so a warm re-trace skips the work.

On a warm cache aot_autograd and the lowering run only to compute a key whose entry exists. The memo maps a
:func:`fingerprint` of what the backend receives from Dynamo to the HLO digest, the specs and the direct call's
plan. It is a prediction only, used when the predicted key's entry is complete and verified and Dynamo calls the
graph directly; anything else takes the full path (``CompiledGraph`` materializes lazily). One signed JSON file per
fingerprint under ``<cache>/.trace-memo/``, written atomically (concurrent writers write equal files); a torn or
foreign file is ignored. ``NEURON_ARGS_TRACE_MEMO=0`` turns it off.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import operator
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from neuron_args import envs
from neuron_args.atomic import write_atomic
from neuron_args.cache import CompileCache
from neuron_args.cache_key import tool_version
from neuron_args.seams.dispatch import OWNED, Plan
from neuron_args.seams.memo_files import FORMAT, memo_path, predicted_digest
from neuron_args.signing import signature_matches, signed
from neuron_args.tensors import TensorSpec
from neuron_args.untrusted import RECORD_LIMIT, load_json, read_bounded

log = logging.getLogger("neuron_args.seams")

#: set to 0 to trace every graph in full (aot_autograd and lowering) even when the memo knows it
ENV = "NEURON_ARGS_TRACE_MEMO"


def enabled() -> bool:
    return envs.flag(ENV)


@dataclass(frozen=True)
class TraceMemo:
    """What one trace produced that the key and the direct call need."""

    graph_sha256: str
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    plan: Plan

    def as_json(self, fp: str) -> str:
        # signed too: a memo chooses which entry a call loads
        return json.dumps(signed({"format": FORMAT, "fingerprint": fp, **asdict(self)}), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, fp: str) -> TraceMemo:
        d = load_json(text, "trace memo")
        digest = predicted_digest(d, fp)
        if digest is None:
            raise ValueError("another format or fingerprint, or no graph digest")
        if not signature_matches(d):
            raise ValueError("not signed with this NEURON_ARGS_CACHE_SIGNING_KEY")
        p = d["plan"]
        plan = Plan(
            n_args=int(p["n_args"]), n_outputs=int(p["n_outputs"]),
            mutated=tuple((int(i), int(j), bool(leaf)) for i, j, leaf in p["mutated"]),
            kinds=tuple(str(k) for k in p["kinds"]))
        specs, outs = (tuple(TensorSpec(tuple(int(n) for n in s["shape"]), str(s["dtype"])) for s in d[name])
                       for name in ("input_specs", "output_specs"))
        # a valid JSON file that is not a direct call's memo must not reach the call
        if len(specs) != plan.n_args or any(not isinstance(getattr(torch, s.dtype, None), torch.dtype)
                                            for s in specs + outs):
            raise ValueError("input specs and plan disagree")
        if any(not 0 <= i < plan.n_args or j != k for k, (i, j, _) in enumerate(plan.mutated)) \
                or len(plan.kinds) != plan.n_outputs or not OWNED.issuperset(plan.kinds):
            raise ValueError("not a direct call's plan")
        return cls(digest, specs, outs, plan)


def load(cache: CompileCache, fp: str) -> TraceMemo | None:
    """The memo of ``fp``, or None (absent, torn, corrupt or of another format: never an error); a read touches the
    file (:func:`prune` goes by its mtime)."""
    path = memo_path(cache, fp)
    try:
        memo = TraceMemo.from_json(read_bounded(path, RECORD_LIMIT), fp)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("trace memo %s ignored: %r", fp, exc)
        return None
    with contextlib.suppress(OSError):  # a read-only cache keeps its dates
        os.utime(path)
    return memo


def store(cache: CompileCache, fp: str, memo: TraceMemo) -> None:
    """Write the memo atomically; a failure (read-only or full disk) only loses the shortcut."""
    try:
        write_atomic(memo_path(cache, fp), memo.as_json(fp))
    except OSError as exc:
        log.debug("trace memo %s not written: %r", fp, exc)


def forget(cache: CompileCache, fp: str) -> None:
    with contextlib.suppress(OSError):  # best effort: a memo that stays is re-checked against its entry
        memo_path(cache, fp).unlink(missing_ok=True)


@functools.lru_cache(maxsize=None)
def lowering_tool_versions() -> tuple[tuple[str, str], ...]:
    """Versions of everything that shapes the HLO (package metadata, no import): a key component, and fingerprinted."""
    dists = ("torch", "torchax", "jax", "jaxlib", "neuron-args")
    return tuple((d, tool_version(d)) for d in dists) + (("jax_x64", "off"),)


class NoFingerprint(Exception):
    """The trace holds something the fingerprint cannot pin down (its values are unknown or opaque)."""


def fingerprint(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """sha256 of everything a seam's trace of ``gm`` depends on, or None when something cannot be pinned.

    No seam nor option is hashed (they enter the key at call time): a graph a trace child's capture seam traced is known
    to the compile seam of the pytest process."""
    h = hashlib.sha256()
    h.update(f"trace-memo {FORMAT}\n".encode())
    h.update(_lowering_identity().encode())
    h.update(f"grad={torch.is_grad_enabled()} inference={torch.is_inference_mode_enabled()} "
             f"autocast={torch._C._is_any_autocast_enabled()}\n".encode())
    try:
        for x in example_inputs:
            if not isinstance(x, torch.Tensor) or type(x).__name__ not in ("FakeTensor", "Tensor", "Parameter"):
                raise NoFingerprint(f"input of type {type(x).__name__}")
            h.update(repr((tuple(x.shape), x.stride(), x.storage_offset(), str(x.dtype), str(x.device),
                           x.requires_grad, x.is_leaf, x._is_view())).encode())
        for name, mod in gm.named_modules():
            if not isinstance(mod, torch.fx.GraphModule):
                raise NoFingerprint(f"submodule {name!r} is not a graph")
            # its source as ``mod.code`` reads it, not compiled: Dynamo hands the backend a lazy graph module, whose
            # ``code`` would generate, compile and exec its forward, which a memo hit never runs
            h.update(f"module {name}\n{mod.graph.python_code(root_module='self').src}\n".encode())
            for node in mod.graph.nodes:
                if node.op == "get_attr":
                    h.update(f"attr {node.target}=".encode())
                    h.update(_attr_digest(operator.attrgetter(node.target)(mod)).encode())
                elif node.op == "call_function":
                    h.update(_function_digest(node.target).encode())
    except NoFingerprint as why:
        log.debug("no trace memo for this graph: %s", why)
        return None
    return h.hexdigest()


def _attr_digest(value: Any) -> str:
    if isinstance(value, torch.fx.GraphModule):
        return "graph module\n"  # its code is hashed as a submodule
    if isinstance(value, torch.Tensor):
        if type(value).__name__ not in ("Tensor", "Parameter") or value.device.type != "cpu":
            raise NoFingerprint(f"a constant of type {type(value).__name__} on {value.device}")
        t = value.detach().contiguous().reshape(-1)
        data = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest() if t.numel() else ""
        return f"{value.dtype}{tuple(value.shape)}{value.stride()} {data}\n"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value) + "\n"
    raise NoFingerprint(f"a constant of type {type(value).__name__}")


def _function_digest(target: Any) -> str:
    """A graph node's function: torch's own by name (torch's version is hashed), a custom op by schema, a
    Python function of the user's (``allow_in_graph``) by its code too, which the graph's code only names."""
    if isinstance(target, torch._ops.OpOverload):
        return f"op {target._schema}\n{_decomposition_digest(target)}"
    module = getattr(target, "__module__", None) or ""
    code = getattr(target, "__code__", None)
    if code is None or module.split(".")[0] in ("torch", "operator", "_operator", "math", "builtins"):
        return f"fn {module}.{getattr(target, '__qualname__', repr(target))}\n"
    return f"fn {module}.{target.__qualname__} {_code_digest(code)}\n"


# namespaces of torch's own ops: their kernels are torch's (its version is hashed)
_TORCH_NAMESPACES = frozenset({"aten", "prims", "_c10d_functional", "c10d", "c10d_functional", "quantized",
                               "_quantized", "quantized_decomposed", "mkldnn", "higher_order"})


def _decomposition_digest(op: torch._ops.OpOverload) -> str:
    """A user's op decomposes through its CompositeImplicitAutograd kernel (aot_autograd and the lowering
    run it), which the schema does not pin: its Python code is hashed; one held in C++ (registered with
    ``Library.impl``) cannot be read, so such a graph gets no memo."""
    if op.namespace in _TORCH_NAMESPACES:
        return ""
    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    kernel = op.py_kernels.get(cia)
    if kernel is not None:
        return f"decomposition {_callable_digest(kernel)}\n"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), cia):
        raise NoFingerprint(f"custom op {op.name()} decomposes through a kernel registered in C++")
    return ""


def _code_digest(code: Any) -> str:
    """A code object's bytecode, names and constants (nested functions' code included)."""
    h = hashlib.sha256(code.co_code + repr(code.co_names).encode())
    for const in code.co_consts:
        h.update((_code_digest(const) if hasattr(const, "co_code") else repr(const)).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _lowering_sources() -> str:
    """sha256 of the lowering's own sources: a changed lowering must not reuse a digest it no longer makes."""
    from neuron_args import lowering, tensors

    h = hashlib.sha256()
    folder = Path(lowering.__file__).parent
    for path in sorted(folder.glob("*.py")) + [Path(tensors.__file__)]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _lowering_identity() -> str:
    """Tool versions, lowering sources, jax's environment and the registered op lowerings (users' too)."""
    from neuron_args.lowering import ops

    jax_env = sorted(envs.snapshot(("JAX_", "TORCHAX_")).items())
    lines = [repr(lowering_tool_versions()), _lowering_sources(), repr(jax_env)]
    for name, fn in sorted(ops.LOWERINGS.items()):
        lines.append(f"{name} {_callable_digest(fn)}")
    return "\n".join(lines) + "\n"


def _callable_digest(fn: Any, depth: int = 3) -> str:
    """A lowering by what it runs: its code and closure cells, or a ``functools.partial``'s function and
    arguments. Anything else by ``repr`` (an address in it only costs the shortcut across processes)."""
    if isinstance(fn, functools.partial) and depth:
        return f"partial({_callable_digest(fn.func, depth - 1)}, {fn.args!r}, {sorted(fn.keywords.items())!r})"
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell (a name assigned after the closure was made)
            cells.append(cell.cell_contents)
    inner = [_callable_digest(v, depth - 1) if callable(v) and depth else repr(v) for v in cells]
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')} {_code_digest(code)} {inner}"
