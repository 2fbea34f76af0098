"""MoE routing in the RL trainer (rlkube.trainer.rl.router) on the tiny Qwen3-MoE: the step's
load per expert and balance loss are what transformers computes on the same tokens, and router
replay routes every token to the experts it is given."""

import pytest
import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.attention import Segments
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.router import RouterProbe
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_trainer import (
    RecordingMetrics,
    RecordingPublisher,
    Server,
    SyntheticSource,
    synthetic_batch,
)

EXPERTS, TOP_K, LAYERS = 4, 2, 4


def own_routing(model, batch) -> list[torch.Tensor]:
    """Each layer's router logits [tokens, experts] for `batch`, as the model computes them."""
    segments = Segments(batch["sample_ids"], batch["prefix_ids"])
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], segments=segments,
                    output_router_logits=True, logits_to_keep=1)
    return list(out.router_logits)


def routed_experts(chosen: list[torch.Tensor]) -> torch.Tensor:
    """Per-layer top-k indices [tokens, k] as a batch's `routed_experts` [1, tokens, layers, k]."""
    return torch.stack(chosen, dim=1).unsqueeze(0)


@pytest.fixture
def env(tiny_moe_model, tmp_path, world_of_one):
    config = TrainerConfig(output_dir=tmp_path, model={"name": str(tiny_moe_model)}, max_steps=1, device="cpu",
                           rollouts={"port": free_port(), "timeout_s": 60})
    return config, build_training_env(config)


def test_a_step_logs_the_load_per_expert_and_the_models_balance_loss(env):
    config, training = env
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    batch["inference_logprobs"] = policy_logprobs(training.model, batch)[0].detach()
    mask = batch["loss_mask"].reshape(-1)
    logits = [layer[mask] for layer in own_routing(training.model, batch)]
    slots = torch.bincount(torch.cat([lg.topk(TOP_K).indices.reshape(-1) for lg in logits]), minlength=EXPERTS)
    expected_aux = float(load_balancing_loss_func(tuple(logits), EXPERTS, TOP_K))

    trainer = RLTrainer(config, training, RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=60),
                        RecordingPublisher(), None, RecordingMetrics())
    with Server(SyntheticSource(batch), config.rollouts.port):
        trainer.train()
    step = trainer.metrics.records[1]
    load = [step[f"router/load/expert_{e}"] for e in range(EXPERTS)]
    assert load == pytest.approx((slots / slots.sum()).tolist(), abs=1e-6)
    assert step["router/load_max"] == pytest.approx(max(load)) and step["router/load_min"] == pytest.approx(min(load))
    assert 0 < step["router/load_entropy"] <= 1
    assert step["router/aux_loss"] == pytest.approx(expected_aux, rel=1e-5)
    assert "mismatch_kl/mean" in step and not any(k.startswith("router/prob") for k in step)
    assert "router/mismatch/fraction" not in step, "the batch carries no routing from inference"


def test_router_replay_routes_each_token_to_the_experts_it_is_given(env):
    _, training = env
    model = training.model
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    logits = own_routing(model, batch)
    own = [lg.topk(TOP_K).indices for lg in logits]
    least = [(-lg).topk(TOP_K).indices for lg in logits]  # the experts the model likes least
    free = policy_logprobs(model, batch)[0]

    probe = RouterProbe.attach(model, replay=True)
    with probe.micro_batch(batch | {"routed_experts": routed_experts(own)}):
        same = policy_logprobs(model, batch)[0]
        stats = probe.stats(batch["global_loss_tokens"])
    assert torch.equal(same, free), "replaying the trainer's own routing changes nothing"
    assert float(stats["router/mismatch/fraction"]) == 0.0

    forced_experts = routed_experts(least)
    forced_experts[0, :3] = -1  # positions inference has no routing for keep the trainer's own
    with probe.micro_batch(batch | {"routed_experts": forced_experts}):
        forced = policy_logprobs(model, batch)[0]
        stats = probe.stats(batch["global_loss_tokens"])
    mask = batch["loss_mask"].reshape(-1)
    used = torch.cat([layer[mask] for layer in least])
    load = torch.bincount(used.reshape(-1), minlength=EXPERTS) / used.numel()
    assert [float(stats[f"router/load/expert_{e}"]) for e in range(EXPERTS)] == pytest.approx(load.tolist())
    assert float(stats["router/mismatch/fraction"]) == pytest.approx(1.0), "every loss token's top-k differs"
    assert not torch.allclose(forced[batch["loss_mask"]], free[batch["loss_mask"]])

    with pytest.raises(ValueError, match="carries no routed_experts"), probe.micro_batch(batch):
        pass


def test_routing_is_read_by_decoder_layer_when_dense_layers_sit_between_moe_layers():
    """vLLM returns a row for every decoder layer; with layer 1 dense the routers are those of
    layers 0, 2 and 3, and replay reads those rows (the dense layer's row is never read)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=EXPERTS, num_experts_per_tok=TOP_K, mlp_only_layers=[1])
    model = Qwen3MoeForCausalLM(config).eval()
    probe = RouterProbe.attach(model, replay=True)
    assert len(probe.routers) == 3
    input_ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        free = model(input_ids=input_ids, output_router_logits=True)
    own = [lg.topk(TOP_K).indices for lg in free.router_logits]
    given = torch.stack([own[0], torch.full_like(own[0], 7), own[1], own[2]], dim=1).unsqueeze(0)
    batch = {"routed_experts": given, "loss_mask": torch.ones(1, 12, dtype=torch.bool)}
    with torch.no_grad(), probe.micro_batch(batch):
        replayed = model(input_ids=input_ids).logits
        stats = probe.stats(global_loss_tokens=12)
    assert torch.equal(replayed, free.logits)
    assert float(stats["router/mismatch/fraction"]) == 0.0
