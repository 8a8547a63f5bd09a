"""The deferred compile flow: capture in parallel children, then build every NEFF in parallel."""
from neuron_args.deferred.jobs import TraceJob, build_trace_job
from neuron_args.deferred.parallel_compile import (
    CompileProgress,
    CompileReport,
    ParallelCompileError,
    parallel_compile,
)
from neuron_args.deferred.parallel_trace import TraceResult, parallel_trace

#: A runner's warmup flows: compile in-process, or trace and compile in parallel through this package.
FLOWS: tuple[str, ...] = ("in-process", "parallel")

__all__ = ["FLOWS", "CompileProgress", "CompileReport", "ParallelCompileError", "TraceJob", "TraceResult",
           "build_trace_job", "parallel_compile", "parallel_trace"]
