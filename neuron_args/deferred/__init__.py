"""The deferred compile flow: capture in parallel children, then build every NEFF in parallel."""
from neuron_args.deferred.jobs import TraceJob, build_trace_job
from neuron_args.deferred.parallel_compile import (
    CompileProgress,
    CompileReport,
    ParallelCompileError,
    parallel_compile,
)
from neuron_args.deferred.parallel_trace import TraceResult, parallel_trace

__all__ = ["CompileProgress", "CompileReport", "ParallelCompileError", "TraceJob", "TraceResult", "build_trace_job",
           "parallel_compile", "parallel_trace"]
