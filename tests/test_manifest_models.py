"""A session manifest over two models names both: its config's model (and ``neuron-args manifest show``'s first
line) once named only the first model that warmed up, though the manifest listed the other's graphs too."""
from __future__ import annotations

import json

import pytest

from neuron_args.cli import main
from neuron_args.manifest.config import merge_configs

OTHER_CONFTEST = '''
import pytest
import torch

from neuron_args.graphs import GraphSpec


class WideModel(torch.nn.Sequential):  # another model, with a graph type and shapes of its own
    def neuron_graphs(self):
        return [GraphSpec("encoder", self, {"b2": lambda: {"input": torch.ones(2, 8)}})]


@pytest.fixture(scope="session")
def neuron_model():
    return WideModel(torch.nn.Linear(8, 32))
'''


def test_a_session_over_two_models_names_both_in_its_manifest(neuron_project: pytest.Pytester, tmp_path, capsys):
    neuron_project.makepyfile(test_tiny="def test_tiny(neuron_warmup):\n    assert neuron_warmup.graphs\n")
    other = neuron_project.mkpydir("other")
    (other / "conftest.py").write_text(OTHER_CONFTEST)
    (other / "test_wide.py").write_text("def test_wide(neuron_warmup):\n    assert neuron_warmup.graphs\n")
    manifests = tmp_path / "manifests"
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-manifest-dir={manifests}",
                                      f"--neuron-cache-dir={tmp_path / 'cache'}")
    result.assert_outcomes(passed=2)
    doc = json.loads((manifests / "nodev" / "manifest.json").read_text())
    assert doc["config"]["model"] == "WideModel + TinyTwoGraph"  # in the order they warmed up
    assert sorted(doc["config"]["neuron_config"]["graph_types"].values()) == ["decode", "encoder", "prefill"]
    capsys.readouterr()
    assert main(["manifest", "show", str(manifests)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("manifest v1  models=WideModel + TinyTwoGraph  target=trn2")


def test_merged_configs_name_each_model_once_and_drop_values_they_disagree_on():
    tiny = {"model": "tiny", "target": "trn2", "dtype": "torch.float32", "max_model_len": 64, "max_num_seqs": 4}
    llama = {"model": "llama", "target": "trn2", "dtype": "torch.float32", "max_model_len": 256, "max_num_seqs": 4}
    merged = merge_configs(merge_configs(tiny, llama), tiny)
    assert merged == {"model": "tiny + llama", "target": "trn2", "dtype": "torch.float32", "max_model_len": None,
                      "max_num_seqs": 4}
    assert merge_configs(tiny, None) == tiny and merge_configs(tiny, dict(tiny)) == tiny
