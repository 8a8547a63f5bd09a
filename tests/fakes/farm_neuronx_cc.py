"""A stand-in ``neuronx-cc`` for the compile-farm tests: its behaviour is chosen per graph by graph.hlo.

graph.hlo holds ``FARM:<mode>``: ``ok`` writes an executable; ``fail`` exits 1 with a log;
``sleep`` sleeps 60 s (until killed); ``sleep-once`` sleeps the first time only (a worker killed
mid-compile, then a retry). ``$FARM_FAKE_STATE`` is a folder where it records each compile
(``<name>.calls``, one line per call) and writes ``<name>.started`` with its pid before sleeping;
``<name>`` is the graph.hlo content after the mode. ``--version`` prints ``$FARM_FAKE_VERSION``
(default 2.21.0.0).
"""
import os
import sys
import time

VERSION = os.environ.get("FARM_FAKE_VERSION", "2.21.0.0")


def main(argv):
    if argv == ["--version"]:
        print(f"NeuronX Compiler version {VERSION}")
        return 0
    opts = dict(zip(argv[2:10:2], argv[3:10:2]))
    with open(argv[1], "rb") as f:
        mode, _, name = f.read().decode().removeprefix("FARM:").partition(":")
    state = os.environ.get("FARM_FAKE_STATE", ".")
    with open(os.path.join(state, f"{name}.calls"), "a") as f:
        f.write(f"{os.getpid()} {os.getcwd()}\n")
    with open(opts["--logfile"], "w") as log:
        log.write(f"fake neuronx-cc {VERSION}: {mode} {name} in {os.getcwd()}\n")
    if mode in ("sleep", "sleep-once"):
        flag = os.path.join(state, f"{name}.slept")
        if mode == "sleep" or not os.path.exists(flag):
            open(flag, "w").close()
            started = os.path.join(state, f"{name}.started")
            with open(started + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(started + ".tmp", started)
            time.sleep(60)
    if mode == "fail":
        print(f"fake neuronx-cc: graph {name} does not compile", file=sys.stderr)
        return 1
    with open(opts["--output"], "wb") as out:
        out.write(b"NEFF" + name.encode() * 100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
