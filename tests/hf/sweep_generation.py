"""The generation tests of the suite over every model and dtype: slower, run by hand or by scripts/model_coverage.py.

    .venv/bin/python -m pytest tests/hf/sweep_generation.py -q -p no:randomly

Not collected by the suite (the name does not start with ``test_``); a path given to pytest is.
Encoder-decoders (T5, BART, Whisper) served through the runner and through a compiled ``generate()``;
decoders (Llama, Qwen2, Mistral, Gemma 2, GPT-2) through a compiled static-cache ``generate()`` in fp32
and fp16 (Mistral and Gemma 2 also with ``neuron_args.hf.static_cache``: transformers' sliding-window static
layers make every decode step a graph of its own). The checks are the suite's (``test_seq2seq_generation.py``, ``test_decoder_generate.py``).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hf.generation_models import SEQ2SEQ
from tests.hf.test_decoder_generate import DTYPES, GENERATE, SLIDING, check_generate
from tests.hf.test_seq2seq_generation import (  # noqa: F401 - collected here, with every model
    TEXT_SEQ2SEQ, check_compiled_generate, check_padded_batch, check_parallel_flow, check_prefill_miss, serve_seq2seq,
    test_a_second_request_reads_its_own_encoder_states, test_each_graph_has_its_own_arguments_and_serving_compiles_nothing,
    test_the_manifest_names_each_graph_with_its_level, test_tokens_and_logits_equal_transformers_generate,
)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module", params=sorted(SEQ2SEQ))
def served(request: pytest.FixtureRequest, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from serve_seq2seq(request.param, hf_cache, tmp_path_factory.mktemp(f"manifest-{request.param}"))


def test_a_prefill_of_another_length_is_a_miss_naming_the_graph_and_the_fix(served):
    check_prefill_miss(served)


@pytest.mark.parametrize("name", TEXT_SEQ2SEQ)
def test_a_padded_batch_with_its_encoder_mask_generates_like_transformers(name):
    check_padded_batch(name)


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_encoder_decoder_warmed_up_in_the_parallel_flow_generates_the_same(name, tmp_path):
    check_parallel_flow(name, tmp_path / "cache")  # a cache of its own: every graph is traced in a child


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_generate_of_a_compiled_encoder_decoder_gives_eager_tokens(name, hf_cache):
    check_compiled_generate(name, hf_cache)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", GENERATE)
def test_static_cache_generate_of_a_compiled_decoder_gives_eager_tokens(name, dtype, hf_cache):
    check_generate(name, dtype, hf_cache)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(SLIDING))
def test_generate_with_the_neuron_static_cache_keeps_one_decode_graph(name, dtype, hf_cache):
    check_generate(name, dtype, hf_cache, cache="neuron")
