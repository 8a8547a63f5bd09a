"""``neuron_args.launch``: engines x ranks as processes, each with its rank's torch.distributed environment and
its engine's device window and rendezvous port; the worst exit code is the result."""
from __future__ import annotations

import json
from pathlib import Path

from neuron_args.launch import ENGINE_ENV, WorkerInfo, device_window, launch, worker_info

RANK_SCRIPT = """
import json, os, sys
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NEURON_VISIBLE_DEVICES",
         "NEURON_ARGS_ENGINE", "NEURON_ARGS_DP", "OMP_NUM_THREADS", "EXTRA")
out = os.path.join(sys.argv[1], f"{os.environ['NEURON_ARGS_ENGINE']}-{os.environ['RANK']}.json")
with open(out, "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
sys.exit(3 if os.environ["NEURON_ARGS_ENGINE"] == "1" and os.environ["RANK"] == "1" else 0)
"""


def test_two_engines_of_two_ranks_each_get_their_window_port_and_rank(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    assert launch([str(script), str(tmp_path)], tp=2, dp=2, env={"EXTRA": "x"}, timeout=120) == 3  # the worst
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(seen) == ["0-0", "0-1", "1-0", "1-1"]
    for name, env in seen.items():
        engine, rank = name.split("-")
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["NEURON_ARGS_DP"]) == (rank, rank, "2", "2")
        assert env["NEURON_VISIBLE_DEVICES"] == ("0-1" if engine == "0" else "2-3") and env[ENGINE_ENV] == engine
        assert (env["MASTER_ADDR"], env["OMP_NUM_THREADS"], env["EXTRA"]) == ("127.0.0.1", "1", "x")
    assert seen["0-0"]["MASTER_PORT"] == seen["0-1"]["MASTER_PORT"] != seen["1-0"]["MASTER_PORT"]  # one per engine


def test_device_windows_and_this_process_s_worker_info(monkeypatch) -> None:
    assert [device_window(e, 2) for e in range(3)] == ["0-1", "2-3", "4-5"] and device_window(3, 1) == "3"
    for name in ("RANK", "WORLD_SIZE", ENGINE_ENV, "NEURON_ARGS_DP"):
        monkeypatch.delenv(name, raising=False)
    assert worker_info() == WorkerInfo(0, 1, 0, 1) and not worker_info().distributed
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert worker_info().distributed and worker_info().rank == 1
