"""LoRA (rlkube.trainer.lora): the adapter module and its merge, config errors, the LoRA model
as the trainers build it, adapter-only publishing and export, and an exact RL resume."""

from collections import OrderedDict

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from pydantic import ValidationError
from rlkube.config import (
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    WeightTransferConfig,
)
from rlkube.models.lora_math import PEFT_PREFIX, is_adapter_key, merge_adapters, merged_weights
from rlkube.trainer.lora import (
    LoraLinear,
    adapter_config,
    adapter_state_dict,
    apply_lora,
    init_adapters,
)
from rlkube.trainer.model import build_model, load_tokenizer
from rlkube.trainer.optim import build_optimizer
from rlkube.trainer.weights import export_adapter, export_hf_weights, full_state_dict
from rlkube.transport.publishers import make_publisher
from rlkube.transport.weights import StoragePublisher

from tests.trainer.rl.test_trainer import Server, SyntheticSource, make_trainer, synthetic_batch

RANK, ALPHA = 8, 16.0


def test_merge_is_w_plus_scaling_b_at_a_by_hand():
    base = {"m.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "other.weight": torch.ones(1)}
    adapter = {
        f"{PEFT_PREFIX}m.lora_A.weight": torch.tensor([[1.0, 2.0]]),
        f"{PEFT_PREFIX}m.lora_B.weight": torch.tensor([[1.0], [0.0]]),
    }
    # B @ A = [[1, 2], [0, 0]]; scaled by 2 and added to the identity
    assert merged_weights(base, adapter, 2.0)["m.weight"].tolist() == [[3.0, 4.0], [0.0, 1.0]]


def adapted_layer() -> tuple[torch.nn.Module, torch.nn.Linear]:
    """A one-layer model whose `q_proj` is adapted (rank 2, alpha 4: scaling 2), and a copy
    of the original layer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(q_proj=torch.nn.Linear(6, 4)))
    original = torch.nn.Linear(6, 4)
    original.load_state_dict(model.q_proj.state_dict())
    apply_lora(model, LoraConfig(rank=2, alpha=4.0, target_modules=["q_proj"]))
    init_adapters(model, seed=0)
    return model, original


def test_the_adapted_layer_starts_as_the_base_and_trains_only_the_adapter():
    model, original = adapted_layer()
    assert isinstance(model.q_proj, LoraLinear)
    x = torch.randn(3, 6)
    assert torch.equal(model(x), original(x))
    assert model.q_proj.lora_A.weight.abs().sum() > 0 and model.q_proj.lora_B.weight.abs().sum() == 0
    model(x).pow(2).sum().backward()
    grads = {name: p.grad is not None for name, p in model.named_parameters()}
    assert grads == {"q_proj.weight": False, "q_proj.bias": False,
                     "q_proj.lora_A.weight": True, "q_proj.lora_B.weight": True}


def test_the_merged_weight_computes_what_the_adapted_layer_does():
    model, _ = adapted_layer()
    with torch.no_grad():
        model.q_proj.lora_B.weight.normal_()
    merged = merge_adapters(model.state_dict(), scaling=2.0)
    assert sorted(merged) == ["q_proj.bias", "q_proj.weight"]
    x = torch.randn(3, 6)
    torch.testing.assert_close(F.linear(x, merged["q_proj.weight"], merged["q_proj.bias"]), model(x))


@pytest.mark.parametrize("field", ["trainer.lora", "lora"])
def test_a_target_the_model_lacks_is_an_error_naming_the_field(field):
    model = torch.nn.Sequential(OrderedDict(q_proj=torch.nn.Linear(6, 4)))
    with pytest.raises(ValueError, match=rf"^{field}.target_modules: \['nope'\] name no linear layer.*\['q_proj'\]"):
        apply_lora(model, LoraConfig(target_modules=["q_proj", "nope"]), field)


@pytest.mark.parametrize("fields, field", [
    ({"rank": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
    ({"target_modules": []}, "target_modules"), ({"target_modules": ["q_proj", "q_proj"]}, "target_modules"),
])
def test_invalid_lora_configs_name_the_field(fields, field):
    with pytest.raises(ValidationError, match=field):
        LoraConfig(**fields)


def test_lora_cannot_travel_over_nccl():
    with pytest.raises(ValueError, match="weights.type: 'nccl'.*trainer.lora"):
        make_publisher(WeightTransferConfig(type="nccl"), "unused", "unused", adapter_config={"r": 8})


def lora_model(tiny_model, nonzero_b: bool = True) -> torch.nn.Module:
    """The tiny model with rank-8 adapters as the trainers build it; B made non-zero (so the
    adapters change the outputs) unless asked not to."""
    model = build_model(ModelConfig(name=str(tiny_model)), ParallelConfig(), torch.device("cpu"), torch.float32,
                        lora=LoraConfig(rank=RANK, alpha=ALPHA))
    if nonzero_b:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("lora_B.weight"):
                    param.to_local().copy_(0.05 * torch.randn(param.shape, generator=generator))  # one rank: all of it
    return model


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_built_lora_model_starts_as_the_base_and_optimizes_only_adapters(tiny_model, world_of_one):
    full = build_model(ModelConfig(name=str(tiny_model)), ParallelConfig(), torch.device("cpu"), torch.float32)
    lora = lora_model(tiny_model, nonzero_b=False)
    ids = torch.randint(0, 200, (1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(lora, ids), logits(full, ids))
    optimized = build_optimizer(lora, OptimizerConfig()).param_groups[0]["params"]
    adapters = [p for name, p in lora.named_parameters() if is_adapter_key(name)]
    assert len(optimized) == len(adapters) == 4 * 7 * 2  # 4 layers x 7 projections x (A, B)
    assert {id(p) for p in optimized} == {id(p) for p in adapters}


def test_publishing_sends_the_adapter_alone(tiny_model, tmp_path, world_of_one):
    model = lora_model(tiny_model)
    adapter = adapter_state_dict(model)
    assert len(adapter) == 56 and all(k.startswith(PEFT_PREFIX + "model.layers.") for k in adapter)
    assert f"{PEFT_PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight" in adapter
    config = adapter_config(LoraConfig(rank=RANK, alpha=ALPHA), str(tiny_model))
    lora_dir = StoragePublisher(str(tmp_path / "lora"), str(tiny_model), keep_last=1, adapter_config=config).publish(adapter, 1)
    full_dir = StoragePublisher(str(tmp_path / "full"), str(tiny_model), keep_last=1).publish(
        merge_adapters(full_state_dict(model), ALPHA / RANK), 1)
    files = sorted(p.name for p in (tmp_path / "lora" / "step_1").iterdir())
    assert files == ["COMPLETE", "adapter_config.json", "adapter_model.safetensors"]
    assert lora_dir.endswith("step_1") and full_dir.endswith("step_1")
    lora_bytes = (tmp_path / "lora" / "step_1" / "adapter_model.safetensors").stat().st_size
    full_bytes = (tmp_path / "full" / "step_1" / "model.safetensors").stat().st_size
    assert lora_bytes < full_bytes / 4


def test_exports_write_a_peft_adapter_and_merged_weights_that_compute_the_lora_model(tiny_model, tmp_path, world_of_one):
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = lora_model(tiny_model)
    lora = LoraConfig(rank=RANK, alpha=ALPHA)
    adapter_dir = export_adapter(model, lora, str(tiny_model), tmp_path / "adapter", is_main=True)
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["r"] == RANK
    assert load_file(adapter_dir / "adapter_model.safetensors").keys() == adapter_state_dict(model).keys()
    merged_dir = export_hf_weights(model, load_tokenizer(ModelConfig(name=str(tiny_model))), tmp_path / "merged",
                                   is_main=True, lora=lora)
    ids = torch.randint(0, 200, (1, 16), generator=torch.Generator().manual_seed(0))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    torch.testing.assert_close(logits(merged, ids), logits(model, ids), rtol=1e-4, atol=1e-4)


@pytest.fixture
def lora_trainer_config(tiny_model, tmp_path, world_of_one):
    from rlkube.config import TrainerConfig

    from tests.fixtures.inference import free_port

    return TrainerConfig(
        output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cpu",
        optim={"lr": 1e-2}, ckpt={"interval": 2}, loss={"kl_tau": 0.0}, lora={"rank": RANK, "alpha": ALPHA},
        rollouts={"port": free_port(), "timeout_s": 60},
    )


def test_a_resumed_lora_run_continues_exactly(lora_trainer_config):
    """4 uninterrupted steps, then a restart from the step-2 checkpoint that trains steps 3
    and 4 again: the same losses and the same adapters."""
    from rlkube.trainer.rl.packed import policy_logprobs

    config = lora_trainer_config
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    trainer = make_trainer(config, batch)
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, batch)[0].float()
    with Server(SyntheticSource(batch), config.rollouts.port):
        trainer.train()
        resumed = make_trainer(config.model_copy(update={"ckpt": config.ckpt.model_copy(update={"resume_step": 2})}), batch)
        resumed.train()
    assert resumed.publisher.published.keys() == {2, 3, 4}
    assert all(k.startswith(PEFT_PREFIX) and is_adapter_key(k) for k in trainer.publisher.published[4])
    assert trainer.metrics.records[4]["loss/mean"] != trainer.metrics.records[1]["loss/mean"], "the adapters trained"
    for step in (3, 4):
        assert resumed.metrics.records[step]["loss/mean"] == trainer.metrics.records[step]["loss/mean"], step
    for name, tensor in trainer.publisher.published[4].items():
        assert torch.equal(resumed.publisher.published[4][name], tensor), name
    saved = dcp.FileSystemReader(str(config.output_dir / "checkpoints" / "trainer" / "step_2" / "dcp")).read_metadata()
    model_keys = [k.removeprefix("model.") for k in saved.state_dict_metadata if k.startswith("model.")]
    assert model_keys and all(is_adapter_key(k) for k in model_keys), "the frozen base is not checkpointed"


def test_the_config_error_names_the_field_path():
    from rlkube.config import ConfigError, RLConfig, load_config

    with pytest.raises(ConfigError, match=r"trainer\.lora\.rank: .*greater than or equal to 1"):
        load_config(RLConfig, ["--trainer.lora.rank", "0"])
    assert load_config(RLConfig, ["--trainer.lora.rank", "16"]).process_configs()["trainer"].lora.rank == 16


@pytest.mark.parametrize("serving", ["adapter", "merge"])
def test_the_run_serves_the_adapter_with_vllms_lora_support_or_merges_it(serving):
    """`trainer.lora.serving = "adapter"` starts inference with vLLM's LoRA support at the
    smallest rank vLLM offers that holds the adapter, one adapter slot and rlkube's load route,
    and points the orchestrator at the adapter's name; `merge` sets none of it."""
    from rlkube.config import RLConfig, load_config
    from rlkube.config.inference import POLICY_ADAPTER
    from rlkube.inference.server import LORA_MIDDLEWARE

    from tests.fixtures.inference import vllm_args

    configs = load_config(RLConfig, ["--trainer.lora.rank", "12", "--trainer.lora.serving", serving]).process_configs()
    # As vLLM reads the command line; an adapter served so: tests/inference/test_lora_weights.py.
    args = vllm_args(configs["inference"], on_cpu=True)
    if serving == "merge":
        assert configs["orchestrator"].client.lora_adapter is None and configs["inference"].max_lora_rank is None
        assert not args.enable_lora and LORA_MIDDLEWARE not in args.middleware
        return
    assert configs["orchestrator"].client.lora_adapter == POLICY_ADAPTER
    assert args.enable_lora and args.max_lora_rank == 16 and args.max_loras == 1 and LORA_MIDDLEWARE in args.middleware


@pytest.mark.slow
def test_a_lora_sft_run_exports_its_adapter_and_the_merged_model(tmp_path):
    from rlkube.models.tiny import init_tiny_model
    from transformers import AutoModelForCausalLM

    from tests.trainer.test_sft_train import run_sft, sft_args

    model = init_tiny_model(tmp_path / "model", layers=2, hidden=64, heads=2, kv_heads=1)
    out = tmp_path / "run"
    run_sft(sft_args(model, out, 2, "--lora.rank", "4", "--lora.export-merged"))
    weights = out / "weights"
    assert sorted(p.name for p in (weights / "step_2").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (weights / "final").resolve() == (weights / "step_2_merged").resolve()
    assert AutoModelForCausalLM.from_pretrained(weights / "final").config.num_hidden_layers == 2
