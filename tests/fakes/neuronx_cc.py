"""A stand-in for ``neuronx-cc`` (and for the local compiler program) in driver tests.

Installed by the tests as an executable named ``neuronx-cc`` with this interpreter in its shebang.
It checks the neuronx-cc argv shape, records its argv, writes a log line and an output file.
``FAKE_NEURONX_CC_MODE`` makes it fail: ``exit70``, ``exit1``, ``segv``, ``kill``, ``abort``,
``sleep``, ``no-output``, ``bad-version`` (``--version`` fails).
``FAKE_NEURONX_CC_RECORD``: append the argv (one JSON list a line) to this file.
``FAKE_NEURONX_CC_PIDS``: a folder; each compile writes ``<pid>`` there (and ``<pid>.helper`` for
its helper) so a test can find and reap what it started.
``FAKE_NEURONX_CC_REJECT``: a flag this compiler version does not know: a compile giving it fails as
argparse does (usage line, ``error: unrecognized arguments``, exit status 2) before writing anything.
``FAKE_NEURONX_CC_FILE_LIMIT``: a file-size limit (bytes, below the executable's 64) set before the output
is written, so the write fails as under ``ulimit -f`` (EFBIG; Python ignores SIGXFSZ).
``FAKE_NEURONX_CC_OUTPUT_BYTES``: this many bytes of numbered lines on stdout first (a compiler chatty at a verbose
level), then ``fake neuronx-cc: last line``.
``FAKE_NEURONX_CC_SLEEP``: seconds a compile sleeps *before* writing its output (a slow compile,
or a hung one with a large value); ``FAKE_NEURONX_CC_HELPER=1`` first starts a helper process
that sleeps as long, like neuronx-cc's own subprocesses.
"""
import json
import os
import signal
import sys
import time

VERSION_TEXT = "NeuronX Compiler version 2.21.33363.0+82d8b54d\n\nPython version 3.12\n"


def main(argv):
    mode = os.environ.get("FAKE_NEURONX_CC_MODE", "ok")
    record = os.environ.get("FAKE_NEURONX_CC_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps(argv) + "\n")
    if argv == ["--version"]:
        if mode == "bad-version":
            print("neuronx-cc: internal error", file=sys.stderr)
            return 1
        sys.stdout.write(VERSION_TEXT)
        return 0
    pids = os.environ.get("FAKE_NEURONX_CC_PIDS")
    if pids and argv[:1] == ["compile"]:
        open(os.path.join(pids, str(os.getpid())), "w").close()
    if argv[:1] != ["compile"] or len(argv) < 10 or argv[2:4] != ["--framework", "XLA"]:
        print(f"fake neuronx-cc: unexpected argv {argv}", file=sys.stderr)
        return 64
    reject = os.environ.get("FAKE_NEURONX_CC_REJECT")
    unknown = [a for a in argv[10:] if reject and a.split("=", 1)[0] == reject]
    if unknown:
        print("usage: neuronx-cc compile [-h] --framework {XLA} --target TARGET [--output OUTPUT] ...\n"
              f"neuronx-cc compile: error: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
        return 2
    opts = dict(zip(argv[4:10:2], argv[5:10:2]))
    if set(opts) != {"--target", "--output", "--logfile"} or not os.path.isfile(argv[1]):
        print(f"fake neuronx-cc: bad fixed options or missing input in {argv}", file=sys.stderr)
        return 64
    with open(opts["--logfile"], "w") as log:
        log.write(f"fake neuronx-cc compiling {argv[1]} for {opts['--target']}\n")
        for n in range(40):
            log.write(f"log line {n}\n")
        log.flush()
    print("fake neuronx-cc: stderr says hello", file=sys.stderr, flush=True)
    chatty = int(os.environ.get("FAKE_NEURONX_CC_OUTPUT_BYTES", "0") or 0)
    if chatty:
        line = b"x" * 99 + b"\n"
        for _ in range(chatty // len(line)):
            sys.stdout.buffer.write(line)
        sys.stdout.buffer.write(b"fake neuronx-cc: last line\n")
        sys.stdout.flush()
    delay = float(os.environ.get("FAKE_NEURONX_CC_SLEEP", "0") or 0)
    if delay:
        if os.environ.get("FAKE_NEURONX_CC_HELPER") == "1":
            import subprocess

            helper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({delay})"])
            if pids:
                open(os.path.join(pids, f"{helper.pid}.helper"), "w").close()
        time.sleep(delay)
    limit = os.environ.get("FAKE_NEURONX_CC_FILE_LIMIT")
    if limit:  # a job's file-size limit (ulimit -f) below the executable's size (not the log's): EFBIG
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), hard))
        try:
            with open(opts["--output"], "wb") as out:
                out.write(b"NEFF" + b"\0" * 60)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # the traceback still reaches the log
    if mode != "no-output":
        with open(opts["--output"], "wb") as out:
            out.write(b"NEFF" + b"\0" * 60)  # a half-written executable the driver must discard
            out.flush()
    if mode == "exit70":
        return 70
    if mode == "exit1":
        return 1
    if mode == "sleep":
        time.sleep(60)
    if mode in ("segv", "kill", "abort"):
        sig = {"segv": signal.SIGSEGV, "kill": signal.SIGKILL, "abort": signal.SIGABRT}[mode]
        if sig != signal.SIGKILL:  # SIGKILL cannot be caught, nor reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
