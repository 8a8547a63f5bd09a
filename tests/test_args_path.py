"""The compiler arguments' path from ``--neuron-compiler-args`` to the compiler's argv (issue #28): plugin options,
runner, settings, scope, seams, cache_key, compilers/base, the driver. No module on it only carries the list on."""
from __future__ import annotations

import importlib.util

from neuron_args import scope
from neuron_args.compilers import base


def test_the_resolver_lives_with_the_scope_and_the_entry_build_with_the_compiler():
    assert (scope.CompilerArgsResolver.__module__, scope.scoped_compiler_args.__module__) == ("neuron_args.scope",) * 2
    assert {f.__module__ for f in (base.compile_entry, base.check_keyed_build, base.check_keyed_compiler,
                                   base.Compiler.compile)} == {"neuron_args.compilers.base"}
    assert [name for name in ("neuron_args.resolver", "neuron_args.compilers.build")
            if importlib.util.find_spec(name) is not None] == []
