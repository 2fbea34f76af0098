"""The trainer's memory estimate (`rlkube.trainer.memory`) against what the trainer measured on
a GPU, and how it moves with the knobs that shard or free memory."""

import pytest
from rlkube.config import LoraConfig, ModelConfig, ParallelConfig, TrainerCommonConfig
from rlkube.trainer.memory import GIB, RL_LOGITS_BYTES, model_shape, trainer_memory
from rlkube.trainer.rl.packed import LOGPROB_CHUNK

from tests.fixtures.hub import hub_offline

CHECKPOINTED = TrainerCommonConfig(parallel=ParallelConfig(activation_checkpointing=True))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    hub_offline(monkeypatch)


@pytest.mark.parametrize(("name", "measured_gib"), [("Qwen/Qwen3-0.6B", 12.3), ("Qwen/Qwen3-1.7B", 32.1)])
def test_the_estimate_matches_the_peak_measured_on_an_h200(name, measured_gib):
    """benchmarks/RESULTS.md: `benchmarks/trainer_throughput.py` on one H200, 16,384-token GRPO rows one
    per micro-batch, activation checkpointing, bf16 compute: peak allocated 12.3 GiB (0.6B: the
    forward/backward's logits chunk sets it) and 32.1 GiB (1.7B: the optimizer step does)."""
    memory = trainer_memory(model_shape(ModelConfig(name=name)), CHECKPOINTED, 2, 16384, 1,
                            RL_LOGITS_BYTES, LOGPROB_CHUNK)
    assert memory.peak / GIB == pytest.approx(measured_gib, rel=0.03)


def test_ranks_shard_the_states_and_lora_trains_only_the_adapters():
    shape = model_shape(ModelConfig(name="Qwen/Qwen3-8B"))
    one, eight = (trainer_memory(shape, CHECKPOINTED, 2, 8192, world, RL_LOGITS_BYTES, LOGPROB_CHUNK) for world in (1, 8))
    assert eight.weights == one.weights / 8 and eight.optimizer == one.optimizer / 8
    assert one.weights + one.gradients + one.optimizer == 16 * shape.params  # float32 weights, grads, two moments
    lora = model_shape(ModelConfig(name="Qwen/Qwen3-8B"), LoraConfig(rank=32))
    adapted = trainer_memory(lora, CHECKPOINTED, 2, 8192, 1, RL_LOGITS_BYTES, LOGPROB_CHUNK)
    adapters = 32 * 36 * (4096 + 4096 + 4096 + 1024 + 4096 + 1024 + 4096 + 4096 + 2 * (4096 + 12288) + 12288 + 4096)
    assert lora.trainable == adapters
    assert adapted.optimizer == 8 * adapters and adapted.weights == 4 * lora.params


def test_activation_checkpointing_and_shorter_rows_cut_activations():
    shape = model_shape(ModelConfig(name="Qwen/Qwen3-4B"))
    kept = trainer_memory(shape, TrainerCommonConfig(), 2, 8192, 1, RL_LOGITS_BYTES, LOGPROB_CHUNK)
    recomputed = trainer_memory(shape, CHECKPOINTED, 2, 8192, 1, RL_LOGITS_BYTES, LOGPROB_CHUNK)
    assert recomputed.activations < kept.activations / 5
    assert trainer_memory(shape, TrainerCommonConfig(), 2, 4096, 1, RL_LOGITS_BYTES, LOGPROB_CHUNK).activations < (
        kept.activations / 1.8)  # halves, but for the fixed chunk of logits
