"""The neuronx-cc option table, the one answer policies, the cache key and the manifest share to "which tokens are
one option, and its value?" (pure Python). Strict reading raises :class:`CompilerArgsError` on what neuronx-cc would
reject, so a typo fails on a laptop; lenient editing keeps unknown tokens, as it edits lists it does not own."""
from __future__ import annotations

import difflib
import functools
import re
import shlex
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from neuron_args.activity import ACTIVITY
from neuron_args.errors import CompilerArgsError, CompilerArgsWarning
from neuron_args.target import KNOWN_TARGETS, target_problem

__all__ = ["KNOWN_TARGETS", "OPT_LEVELS", "Flag", "FlagChanges", "OptionSpec", "OPTIONS", "RepeatedOption",
           "CompilerArgs", "canonical_compiler_args", "closest_option", "flag_changes", "manifest_compiler_flags",
           "optimization_level", "parse_compiler_args", "remove_options", "repeated_options", "split_compiler_args",
           "validate_compiler_args", "warn_repeated_options", "with_optimization_level"]

OPT_LEVELS: tuple[int, ...] = (1, 2, 3)

OPTLEVEL = "--optlevel"
INTERNAL_PREFIX = "--internal-"

# Value kinds of an option.
SWITCH = "switch"  # no value
CHOICE = "choice"  # one of `choices`
INT = "int"  # a positive integer
PATH = "path"  # a file system path (machine specific: left out of the key and manifest)
TEXT = "text"  # any non-empty string
OPAQUE = "opaque"  # a string handed to an inner tool; order sensitive, may start with "-"


@dataclass(frozen=True)
class OptionSpec:
    """One documented neuronx-cc option: its canonical long name, other spellings, value kind."""

    name: str
    kind: str
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def takes_value(self) -> bool:
        return self.kind != SWITCH


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("--target", CHOICE, choices=KNOWN_TARGETS),
    OptionSpec(OPTLEVEL, CHOICE, aliases=("-O",), choices=tuple(str(n) for n in OPT_LEVELS)),
    OptionSpec("--auto-cast", CHOICE, choices=("none", "matmult", "all")),
    OptionSpec("--auto-cast-type", CHOICE, choices=("bf16", "fp16", "tf32", "fp8_e4m3")),
    OptionSpec("--model-type", CHOICE, choices=("generic", "transformer", "unet-inference")),
    OptionSpec("--logical-nc-config", CHOICE, aliases=("--lnc", "-lnc"), choices=("1", "2")),
    OptionSpec("--native-int64", CHOICE, choices=("enabled", "disabled")),
    OptionSpec("--implicit-integer-downcast", TEXT),
    OptionSpec("--enable-saturate-infinity", SWITCH),
    OptionSpec("--enable-mixed-precision-accumulation", SWITCH),
    OptionSpec("--enable-fast-context-switch", SWITCH),
    OptionSpec("--enable-fast-loading-neuron-binaries", SWITCH),
    OptionSpec("--enable-internal-neff-wrapper", SWITCH),
    OptionSpec("--framework", CHOICE, choices=("XLA", "TENSORFLOW", "PYTORCH")),
    OptionSpec("--verbose", CHOICE, choices=("debug", "info", "warning", "error", "critical")),
    OptionSpec("--distribution-strategy", CHOICE, choices=("llm-training",)),
    OptionSpec("--pipeline", TEXT),
    OptionSpec("--num-parallel-jobs", INT, aliases=("--jobs",)),
    OptionSpec("--output", PATH),
    OptionSpec("--logfile", PATH),
    OptionSpec("--workdir", PATH),
    OptionSpec("--compile_workdir", PATH),
    OptionSpec("--tensorizer-options", OPAQUE),
    OptionSpec("--hlo2tensorizer-options", OPAQUE),
)

#: Flags other tools read from ``NEURON_CC_FLAGS`` and strip before neuronx-cc sees them (torch-neuronx's
#: persistent cache): not passed on, and refused with what neuron-args does instead.
FOREIGN_FLAGS: dict[str, str] = {
    "--cache_dir": "torch-neuronx reads it for its own compile cache, and neuronx-cc would reject it. neuron-args "
                   "keeps its own cache: remove it and give that folder as options['cache_dir'], "
                   "$NEURON_LIBTORCH_CACHE_DIR or (pytest) --neuron-cache-dir",
    "--retry_failed_compilation": "torch-neuronx reads it for its compile cache, and neuronx-cc would reject it. "
                                  "Remove it: neuron-args never serves a failed build and compiles the graph "
                                  "again on the next miss",
}

_BY_SPELLING: dict[str, OptionSpec] = {
    spelling: spec for spec in OPTIONS for spelling in (spec.name, *spec.aliases)
}
# Options that name a place on this machine: they do not change the program.
MACHINE_SPECIFIC: frozenset[str] = frozenset(s.name for s in OPTIONS if s.kind == PATH)
_NEGATIVE_NUMBER = re.compile(r"-\d+$")


@dataclass(frozen=True)
class Flag:
    """One option: canonical name (None for a token nothing could identify), value (None for a switch), the tokens
    as given, and why strict parsing rejects it (only a scan, never :func:`parse_compiler_args`, gives one)."""

    name: str | None
    value: str | None
    tokens: tuple[str, ...]
    problem: str | None = None


def split_compiler_args(args: str | Sequence[str] | None) -> list[str]:
    """The tokens as a new list: a string is split shell-style, a list's items stay whole. Each must be an argv
    item: UTF-8 text (an environment variable holding another encoding's byte decodes to a lone surrogate) without
    a NUL; else :class:`CompilerArgsError`."""
    if args is None:
        return []
    if isinstance(args, str):
        try:
            tokens = shlex.split(args)
        except ValueError as exc:
            raise CompilerArgsError(
                f"cannot split compiler args {args!r} shell-style ({exc}); "
                "close the quote or pass a list of tokens"
            ) from None
    elif isinstance(args, (bytes, bytearray)) or not isinstance(args, Sequence):
        raise TypeError(
            "compiler args must be a string, a list or tuple of strings, or None; "
            f"got {type(args).__name__} {args!r}"
        )
    else:
        tokens = list(args)
    for index, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TypeError(
                "compiler args must be a list or tuple of strings; item "
                f"{index} is {type(token).__name__} {token!r}"
            )
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise CompilerArgsError(
                f"compiler argument {token!r} is not UTF-8 text (a byte of another encoding); write it in "
                "UTF-8 (ASCII for flags)") from None
        if "\0" in token:
            raise CompilerArgsError(f"compiler argument {token!r} holds a NUL character, which no argv item can")
    return tokens


def _is_option_like(token: str) -> bool:
    return token.startswith("-") and not _NEGATIVE_NUMBER.match(token) and token != "-"


def _is_internal(head: str) -> bool:
    return head.startswith(INTERNAL_PREFIX) and len(head) > len(INTERNAL_PREFIX)


def _known_name(token: str) -> str | None:
    """The canonical name of the option ``token`` (or its value form) spells, None if unknown (``-O<n>`` too)."""
    head = token.split("=", 1)[0]
    return _BY_SPELLING[head].name if head in _BY_SPELLING else head if _is_internal(head) else None


def _scan(tokens: Sequence[str]) -> list[Flag]:
    """Group tokens into options. Never raises: problems are recorded on the flags."""
    items: list[Flag] = []
    i, n = 0, len(tokens)
    while i < n:
        token = tokens[i]
        head, eq, inline = token.partition("=")
        spec = _BY_SPELLING.get(head)  # -O and -O=<n> included: '-O' is an alias of --optlevel
        name, value, width, problem = spec.name if spec else None, None, 1, None
        if spec is not None and spec.takes_value and not eq:
            # value in the next token: an opaque value may start with '-' (it is another tool's
            # options) unless it is itself one of ours (a token holding a space never is, as in
            # argparse); other values may not look like options.
            nxt = tokens[i + 1] if i + 1 < n else None
            if nxt is not None and (any(c.isspace() for c in nxt) or not (nxt.startswith("-O") or _known_name(nxt))
                                    if spec.kind == OPAQUE else not _is_option_like(nxt)):
                value, width = nxt, 2
            else:
                problem = "missing value"
        elif token.startswith("-O"):  # -O<n>, and the invalid -O=<n>
            name, rest = OPTLEVEL, token[2:]
            if rest.startswith("="):
                problem = f"'{token}' is not a valid -O spelling; write '-O{rest[1:]}' or '--optlevel={rest[1:]}'"
            else:
                value = rest
        elif _is_internal(head):  # --internal-*: opaque pass-through; its value only ever comes with '='
            name, value = head, inline if eq else None
        elif spec is None:
            problem = "unknown flag" if _is_option_like(token) and token != "--" else "stray token"
        elif not spec.takes_value:
            problem = f"'{head}' is a switch and takes no value" if eq else None
        else:
            value = inline
        if spec is not None and spec.kind == INT and value is not None and value.isdecimal():
            value = str(int(value))  # '04' is '4': the key and the repeat check compare values
        items.append(Flag(name, value, tuple(tokens[i:i + width]), problem))
        i += width
    return items


def _value_problem(spec: OptionSpec, value: str) -> str | None:
    if spec.name == "--target":  # the target's one message (neuron_args.target)
        return target_problem(value, "'--target' in the compiler args")
    if spec.kind == CHOICE and value not in spec.choices:
        allowed = ", ".join(spec.choices)
        if spec.name == OPTLEVEL:
            return f"bad optimization level {value!r}; allowed levels are {allowed} (write -O1, -O2 or -O3)"
        return f"invalid value {value!r} for '{spec.name}'; allowed values are {allowed}"
    if spec.kind == INT and not (value.isdecimal() and int(value) > 0):
        return f"invalid value {value!r} for '{spec.name}'; expected a positive integer"
    if spec.kind in (PATH, TEXT) and value == "":
        return f"'{spec.name}' needs a non-empty value"
    return None


def parse_compiler_args(
    args: str | Sequence[str] | None, *, graph_type: str | None = None
) -> list[Flag]:
    """Parse and validate into :class:`Flag` objects; :class:`CompilerArgsError` names flag, fix and ``graph_type``."""
    ctx = f"compiler args for graph type {graph_type!r}: " if graph_type is not None else "compiler args: "
    items = _scan(split_compiler_args(args))
    for index, item in enumerate(items):  # the first problem raises: what is left are the flags
        token = item.tokens[0]
        if item.name is None:
            if item.problem == "unknown flag":
                flag = token.split("=", 1)[0]
                if flag in FOREIGN_FLAGS:
                    raise CompilerArgsError(f"{ctx}'{flag}' (token {token!r}) is not a neuronx-cc flag: "
                                            f"{FOREIGN_FLAGS[flag]}.")
                near = closest_option(flag)
                hint = f" Did you mean '{near}'?" if near else ""
                raise CompilerArgsError(
                    f"{ctx}unknown neuronx-cc flag '{flag}' (token {token!r}).{hint} Fix or "
                    f"remove it; compiler-internal options pass through only as '--internal-...'."
                )
            prev = items[index - 1].name if index else None  # the option the stray token may belong to
            after = f" after '{items[index - 1].tokens[-1]}'" if index else ""
            if prev in _BY_SPELLING and not _BY_SPELLING[prev].takes_value:
                after += " (a switch: it takes no value)"
            elif prev is not None and _is_internal(prev):
                after += f" ('--internal-*' flags take a value only as '{prev}=VALUE')"
            raise CompilerArgsError(
                f"{ctx}stray token {token!r}{after}: only options belong here (the compiler "
                f"driver adds the input file). Remove it, or attach it to its option as "
                f"'--name=value'."
            )
        spec = _BY_SPELLING.get(item.name)
        if item.problem == "missing value":
            choices = f" (one of {', '.join(spec.choices)})" if spec and spec.choices else ""
            example = "-O2" if item.name == OPTLEVEL else f"{token}=VALUE"
            raise CompilerArgsError(f"{ctx}'{token}' needs a value{choices}; write e.g. '{example}'.")
        problem = item.problem or (_value_problem(spec, item.value) if spec and item.value is not None else None)
        if problem is not None:
            raise CompilerArgsError(f"{ctx}{problem} (given as {' '.join(item.tokens)!r}).")
    return items


def validate_compiler_args(
    args: str | Sequence[str] | None, *, graph_type: str | None = None
) -> list[str]:
    """Split and validate; return the token list (a new list) unchanged."""
    return CompilerArgs.parse(args, graph_type=graph_type).argv


def closest_option(name: str) -> str | None:
    """The known spelling nearest to ``name`` (a typo check), or None when nothing is close."""
    known = _known_name(name)
    if known is not None:
        return known
    vocabulary = {s.lower(): s for s in _BY_SPELLING}
    vocabulary.update({f"-o{n}": f"-O{n}" for n in OPT_LEVELS})
    match = difflib.get_close_matches(name.split("=", 1)[0].lower(), list(vocabulary), n=1, cutoff=0.6)
    return vocabulary[match[0]] if match else None


def with_optimization_level(args: str | Sequence[str] | None, level: int) -> list[str]:
    """A new list holding exactly one ``-O<level>``, where the first level was (else appended); every
    other token keeps its place, unknown flags included, so a policy can set the level on any base list."""
    if isinstance(level, bool) or not isinstance(level, int) or level not in OPT_LEVELS:
        allowed = ", ".join(str(n) for n in OPT_LEVELS)
        raise ValueError(f"optimization level must be one of {allowed} (an int, spelled -O<n>); got {level!r}")
    items = _scan(split_compiler_args(args))
    first = next((k for k, item in enumerate(items) if item.name == OPTLEVEL), len(items))
    return [*(t for item in items[:first] for t in item.tokens), f"-O{level}",
            *(t for item in items[first:] if item.name != OPTLEVEL for t in item.tokens)]


def optimization_level(args: str | Sequence[str] | None) -> int | None:
    """The effective ``-O`` level (the last wins, as in neuronx-cc), None if absent; only the level is checked."""
    levels = [item for item in _scan(split_compiler_args(args)) if item.name == OPTLEVEL]
    if not levels:
        return None
    last, spec = levels[-1], _BY_SPELLING[OPTLEVEL]
    if last.problem is not None or last.value not in spec.choices:  # the message names the tokens given
        raise CompilerArgsError(f"compiler args: {_value_problem(spec, ' '.join(last.tokens))}")
    return int(last.value)


def _is_opaque(name: str) -> bool:
    spec = _BY_SPELLING.get(name)
    return name.startswith(INTERNAL_PREFIX) or (spec is not None and spec.kind == OPAQUE)


def _render(name: str, value: str | None) -> str:
    if name == OPTLEVEL:
        return f"-O{value}"
    return name if value is None else f"{name}={value}"


def canonical_compiler_args(args: str | Sequence[str] | None) -> list[str]:
    """The key's form, equal for equal meaning (validated first: a bad list has no key): canonical spellings, a
    repeated option's last value, named options sorted, then opaque ones in order; machine-specific paths dropped."""
    return list(CompilerArgs.of(args).canonical)


class CompilerArgs(tuple):  # type: ignore[type-arg]  # tuple[str, ...]
    """One argument list as a value (the tokens as given), split once where it enters; ``CompilerArgs(args)`` does not
    validate (a policy may edit unknown flags), :meth:`parse` does, once: the parsed flags are kept."""

    def __new__(cls, args: str | Sequence[str] | None = None) -> CompilerArgs:
        return super().__new__(cls, split_compiler_args(args))

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, (list, tuple)) else NotImplemented

    def __ne__(self, other: object) -> bool:
        return tuple(self) != tuple(other) if isinstance(other, (list, tuple)) else NotImplemented

    __hash__ = tuple.__hash__

    def __setattr__(self, name: str, value: object) -> None:  # frozen: what it caches, it derives from the tokens
        raise AttributeError(f"CompilerArgs is immutable (cannot set {name!r})")

    @classmethod
    def of(cls, args: str | Sequence[str] | None) -> CompilerArgs:
        """``args`` as a value (itself when it is one): split and type-checked, not validated."""
        return args if isinstance(args, CompilerArgs) else cls(args)

    @classmethod
    def parse(cls, args: str | Sequence[str] | None, *, graph_type: str | None = None,
              source: str | None = None) -> CompilerArgs:
        """``args`` validated: :class:`CompilerArgsError` names the flag, the fix, ``graph_type`` and ``source``."""
        return cls.of(args).checked(graph_type=graph_type, source=source)

    def checked(self, *, graph_type: str | None = None, source: str | None = None) -> CompilerArgs:
        """This value, validated (a checked value returns at once)."""
        if "flags" not in self.__dict__:
            try:
                self.__dict__["flags"] = tuple(parse_compiler_args(self, graph_type=graph_type))
            except CompilerArgsError as exc:
                if source is None:
                    raise
                raise CompilerArgsError(f"{exc} (these arguments come from {source})") from None
        return self

    @functools.cached_property
    def canonical(self) -> tuple[str, ...]:
        """The key form (:func:`canonical_compiler_args`); validates an unchecked value."""
        named: dict[str, str | None] = {}
        opaque: list[str] = []
        for flag in self.checked().__dict__["flags"]:
            if flag.name in MACHINE_SPECIFIC:
                continue
            if _is_opaque(flag.name):
                opaque.append(_render(flag.name, flag.value))
                continue
            named[flag.name] = flag.value
        return tuple(_render(name, named[name]) for name in sorted(named)) + tuple(opaque)

    argv = property(list, doc="The tokens as the compiler's argv (and JSON) holds them.")
    manifest = property(lambda self: manifest_compiler_flags(self), doc="The manifest's one-line form.")
    level = property(lambda self: optimization_level(self), doc="The effective -O level, None if absent.")

    def with_level(self, level: int) -> CompilerArgs:
        return CompilerArgs(with_optimization_level(self, level))

    def value(self, name: str) -> str | None:
        """The last value given for option ``name`` in any spelling, None if absent (a switch: :meth:`has`)."""
        (canonical,) = _resolve_names([name], what="CompilerArgs.value")
        spec = _BY_SPELLING.get(canonical)
        if spec is not None and not spec.takes_value:
            raise CompilerArgsError(f"CompilerArgs.value: '{canonical}' is a switch and has no value; use .has()")
        values = [item.value for item in self._items() if item.name == canonical and item.value is not None]
        return values[-1] if values else None

    def has(self, name: str) -> bool:
        """True when option ``name`` (any spelling) appears."""
        (canonical,) = _resolve_names([name], what="CompilerArgs.has")
        return any(item.name == canonical for item in self._items())

    def without(self, names: Iterable[str]) -> CompilerArgs:
        """This value without the named options (any spelling, values included); an unknown name is a
        :class:`CompilerArgsError`, so a typo does not silently remove nothing. A checked value stays checked."""
        drop = _resolve_names(names, what="remove_options")
        kept = tuple(flag for flag in self._items() if flag.name not in drop)
        out = CompilerArgs([token for flag in kept for token in flag.tokens])
        if "flags" in self.__dict__:
            out.__dict__["flags"] = kept
        return out

    def _items(self) -> Sequence[Flag]:
        """The parsed flags of a checked value, else the scan (lenient: a policy may edit unknown flags)."""
        return self.__dict__.get("flags") or _scan(self)


def _looks_machine_specific(item: Flag) -> bool:
    """A path option, or an ``--internal-*`` one that dumps or names an absolute path."""
    name, value = item.name or "", item.value or ""
    return name in MACHINE_SPECIFIC or (name.startswith(INTERNAL_PREFIX)
                                        and ("dump" in name.lower() or value.startswith(("/", "~"))))


def manifest_compiler_flags(args: str | Sequence[str] | None) -> str:
    """The manifest's one line: given order, no machine-specific paths, shell-quoted to split back; never raises."""
    try:
        tokens = split_compiler_args(args)
    except (CompilerArgsError, TypeError):  # as given: a list's items as text, anything else split on spaces
        tokens = [str(token) for token in args] if isinstance(args, (list, tuple)) else str(args).split()
    return shlex.join([token for item in _scan(tokens) if not _looks_machine_specific(item) for token in item.tokens])


def _resolve_names(names: Iterable[str], *, what: str) -> set[str]:
    if isinstance(names, str):
        names = [names]
    resolved: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: option names must be strings; got {type(name).__name__} {name!r}")
        canonical = _known_name(name)
        if canonical is None:
            near = closest_option(name)
            hint = f" Did you mean '{near}'?" if near else ""
            raise CompilerArgsError(f"{what}: unknown neuronx-cc option {name!r}.{hint}")
        resolved.add(canonical)
    return resolved


def remove_options(args: str | Sequence[str] | None, names: Iterable[str]) -> list[str]:
    """A new list without the named options (:meth:`CompilerArgs.without`): the policy helper."""
    return list(CompilerArgs.of(args).without(names))


@dataclass(frozen=True)
class RepeatedOption:
    """An option given more than once with different values; neuronx-cc (argparse) keeps the last."""

    name: str
    given: tuple[str, ...]  # every occurrence as written, in order

    @property
    def effective(self) -> str:
        return self.given[-1]


def repeated_options(args: str | Sequence[str] | None) -> list[RepeatedOption]:
    """The options ``args`` gives more than once with different values, in order of first use (lenient;
    equal values in other spellings, switches and order-sensitive opaque options are no conflict)."""
    seen: dict[str, list[tuple[str, str]]] = {}
    for item in _scan(split_compiler_args(args)):
        if item.name is None or item.value is None or item.problem is not None or _is_opaque(item.name):
            continue
        seen.setdefault(item.name, []).append((item.value, " ".join(item.tokens)))
    return [RepeatedOption(name, tuple(given for _, given in uses))
            for name, uses in seen.items() if len({value for value, _ in uses}) > 1]


def warn_repeated_options(
    args: str | Sequence[str] | None, *, source: str, graph_type: str | None = None, hint: str = "",
    warn: Callable[[Warning], None] | None = None, once: bool = True,
) -> list[RepeatedOption]:
    """Warn (:class:`CompilerArgsWarning`) about each option ``args`` repeats with another value, naming
    ``source``, every value, the one in effect and the fix. Once per process (the same list passes the plugin,
    the runner, the scope and the seam) unless ``once=False``."""
    emit = warn if warn is not None else functools.partial(warnings.warn, stacklevel=2)  # C call: no frame of its own
    repeats = repeated_options(args)
    for repeat in repeats:
        first = ACTIVITY.say_once(f"repeated option {repeat.name}: {' '.join(repeat.given)}")
        if once and not first:
            continue
        where = f"graph type {graph_type!r}: " if graph_type is not None else ""
        dropped = ", ".join(repr(g) for g in repeat.given[:-1])
        emit(CompilerArgsWarning(
            f"{where}{source} gives {repeat.name} {len(repeat.given)} times with different values "
            f"({', '.join(repr(g) for g in repeat.given)}); neuronx-cc keeps the last, so {repeat.effective!r} "
            f"is what compiles{'' if repeat.name in MACHINE_SPECIFIC else ' and what the cache key holds'}. "
            f"Fix: give {repeat.name} once in {source} "
            f"(remove {dropped}){'; ' + hint if hint else ''}."))
    return repeats


@dataclass(frozen=True)
class FlagChanges:
    """How one argument list differs from another (empty: false); ``changed`` holds ``(option, old, new)``."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[tuple[str, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def as_dict(self) -> dict[str, list]:
        return {"added": list(self.added), "removed": list(self.removed),
                "changed": [{"option": name, "old": old, "new": new} for name, old, new in self.changed]}


def _by_option(tokens: list[str]) -> dict[str, list[str]]:
    """Canonical tokens by option (``-O3`` under ``--optlevel``, ``--name=value`` under ``--name``)."""
    grouped: dict[str, list[str]] = {}
    for token in tokens:
        name = OPTLEVEL if token.startswith("-O") and not token.startswith("--") else token.split("=", 1)[0]
        grouped.setdefault(name, []).append(token)
    return grouped


def flag_changes(old: Sequence[str], new: Sequence[str]) -> FlagChanges:
    """The option-level difference of two canonical token lists, compared as multisets (order is no change)."""
    removed = list((Counter(old) - Counter(new)).elements())
    added = list((Counter(new) - Counter(old)).elements())
    removed_by, added_by = _by_option(removed), _by_option(added)
    changed = []
    for name in sorted(removed_by.keys() & added_by.keys()):
        if name.startswith("-") and len(removed_by[name]) == 1 and len(added_by[name]) == 1:
            changed.append((name, removed_by[name][0], added_by[name][0]))
            removed.remove(removed_by[name][0])
            added.remove(added_by[name][0])
    return FlagChanges(tuple(sorted(added)), tuple(sorted(removed)), tuple(changed))
