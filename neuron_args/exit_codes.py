"""The exit statuses of every ``neuron-args`` command, one table: CI tells "invalid" from "could not check"."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1  # invalid, different, a regression, a corrupt entry, a graph that failed to build
EXIT_USAGE = 2  # a usage error or an unreadable input (an unreachable scheduler too)
EXIT_REMOTE = 3  # an s3:// cache's remote could not be used (unreachable, refused, boto3 missing)
EXIT_INTERRUPTED = 130  # Ctrl-C, any command (``compile``: entries not built stay pending)
