"""Delta weight updates (`weights.delta`): bit-exact on every replica, whatever it missed."""

import json

import pytest
import torch
from rlkube.config import WeightTransferConfig
from rlkube.transport.publishers import make_publisher
from rlkube.transport.weights_delta import (
    DELTA_FILE,
    ChainReader,
    DeltaPublisher,
    PolicyReplica,
    apply_delta,
    bytes_of,
    encode_delta,
)
from rlkube.transport.weights_snapshot import COMPLETE
from rlkube.transport.weights_storage import list_steps

from tests.fixtures.inference import free_port


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return directory


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view({2: torch.int16, 4: torch.int32}[tensor.element_size()])


def assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(bits(got[name]), bits(tensor)), f"{name} differs from a full publish"


class Training:
    """float32 master weights moved by small steps, published in bfloat16 as the trainer does
    (a tied head: the same tensor under two names)."""

    def __init__(self, lr: float = 1e-5):
        g = torch.Generator().manual_seed(0)
        embed = torch.randn(64, 32, generator=g)
        self.master = {"embed.weight": embed, "lm_head.weight": embed, "layer.weight": torch.randn(32, 32, generator=g),
                       "norm.weight": torch.ones(32)}
        self.lr, self.generator = lr, g

    def step(self, lr: float | None = None) -> dict[str, torch.Tensor]:
        for name, tensor in self.master.items():
            if name != "lm_head.weight":
                tensor += (lr or self.lr) * torch.randn(tensor.shape, generator=self.generator).sign()
        return {name: tensor.to(torch.bfloat16) for name, tensor in self.master.items()}


def test_gaps_past_16_bits_and_a_tensor_of_one_element_round_trip():
    base = {"long": torch.zeros(300_000, dtype=torch.bfloat16), "one": torch.zeros(1, dtype=torch.bfloat16)}
    new = {name: tensor.clone() for name, tensor in base.items()}
    new["long"][[0, 40_000, 40_001, 240_000, 299_999]] = 1.0  # gaps of 40k (a negative int16) and 200k
    new["one"][0] = 2.0
    delta = encode_delta(base, new)
    assert delta["long@gap"].numel() == 5 + 3, "199,999 = 3 words of 65535 skipped + 3394"
    patched = {name: tensor.clone() for name, tensor in base.items()}
    apply_delta(patched, delta)
    assert_bit_exact(patched, new)


def test_a_delta_carries_exactly_the_changed_bits():
    base = {"w": torch.randn(1000).bfloat16(), "same": torch.randn(10).bfloat16(), "most": torch.randn(30).bfloat16(),
            "signs": torch.tensor([0.0, 1.0, float("nan")] * 10).bfloat16()}
    new = {name: tensor.clone() for name, tensor in base.items()}
    new["w"][[3, 500, 999]] += 1
    new["most"][:20] *= 2  # over a third changed: sent whole
    new["signs"][0] = -0.0  # equal values, other bits
    new["signs"][2] = float("nan")  # the same NaN: unchanged
    delta = encode_delta(base, new)
    assert sorted(delta) == ["most", "signs@gap", "signs@val", "w@gap", "w@val"]
    assert delta["w@gap"].tolist() == [4, 497, 499] and delta["w@gap"].dtype == torch.int16
    assert encode_delta(base, new, limit=bytes_of(delta)) is None, "a delta that reaches the limit"
    assert encode_delta(base, new, limit=bytes_of(delta) + 1).keys() == delta.keys()
    patched = {name: tensor.clone() for name, tensor in base.items()}
    apply_delta(patched, delta)
    assert_bit_exact(patched, new)
    with pytest.raises(ValueError, match="lacks"):
        apply_delta({"w": base["w"].clone()}, delta)


@pytest.mark.parametrize("transport", ["storage", "grpc"])
def test_replicas_are_bit_exact_with_a_full_publish_whatever_they_missed(transport, tmp_path, model_dir):
    config = WeightTransferConfig(type=transport, grpc_port=free_port(), keep_last=1, delta={"full_every": 4})
    publisher = make_publisher(config, tmp_path, str(model_dir))
    assert isinstance(publisher, DeltaPublisher)
    training, policies, locations, sizes = Training(), {}, {}, {}
    every, late, rejoined = PolicyReplica(), PolicyReplica(), PolicyReplica()
    try:
        for step in range(1, 8):  # full at 1 and 5, deltas between
            policies[step] = training.step()
            locations[step] = publisher.publish(policies[step], step)
            sizes[step] = publisher.last_bytes
            reader = Recording(locations[step])
            assert_bit_exact(every.update(reader.first(step), reader.read), policies[step])
            assert reader.steps == [step], "a replica that holds the base reads the delta alone"
            if step == 1:
                late.update(reader.first(1), reader.read)
            if step == 3:  # `late` missed delta 2: it reads it, then 3, no full snapshot
                reader = Recording(locations[3])
                assert_bit_exact(late.update(reader.first(3), reader.read), policies[3])
                assert reader.steps == [3, 2]
            if transport == "storage" and step == 3:
                assert set(list_steps(str(tmp_path / "weights"))) == {1, 2, 3}, "keep_last=1 keeps 3's chain"
        reader = Recording(locations[7])  # joins at 7: full snapshot 5, then deltas 6 and 7
        assert_bit_exact(rejoined.update(reader.first(7), reader.read), policies[7])
        assert reader.steps == [7, 6, 5]
    finally:
        publisher.close()
    full = sizes[1]
    assert sizes[5] == full and all(0 < sizes[s] < full / 2 for s in (2, 3, 4, 6, 7)), sizes
    if transport == "storage":
        assert set(list_steps(str(tmp_path / "weights"))) == {5, 6, 7}


@pytest.mark.parametrize("transport", ["storage", "grpc"])
def test_a_delta_that_is_not_meaningfully_smaller_goes_as_a_full_snapshot(transport, tmp_path, model_dir):
    """Step 3 moves every weight (a high learning rate): a full snapshot instead of a delta,
    which starts the count to the next full one and ends the chain a late replica reads."""
    config = WeightTransferConfig(type=transport, grpc_port=free_port(), keep_last=1, delta={"full_every": 3})
    publisher = make_publisher(config, tmp_path, str(model_dir))
    training, policies, locations, sizes, based_on = Training(), {}, {}, {}, {}
    every, late = PolicyReplica(), PolicyReplica()
    try:
        for step in range(1, 7):  # full at 1, 3 (the high lr) and 6 (3 publishes after 3)
            policies[step] = training.step(lr=1.0 if step == 3 else None)
            locations[step] = publisher.publish(policies[step], step)
            sizes[step] = publisher.published_bytes(policies[step])
            reader = Recording(locations[step])
            first = reader.first(step)
            based_on[step] = json.loads(first[COMPLETE]).get("base")
            assert_bit_exact(every.update(first, reader.read), policies[step])
            assert reader.steps == [step]
            if step == 2:
                late.update(reader.first(2), reader.read)
            if step == 5:  # `late` holds 2, missed 3 and 4: full 3, then deltas 4 and 5
                reader = Recording(locations[5])
                assert_bit_exact(late.update(reader.first(5), reader.read), policies[5])
                assert reader.steps == [5, 4, 3]
    finally:
        publisher.close()
    full = sizes[1]
    assert based_on == {1: None, 2: 1, 3: None, 4: 3, 5: 4, 6: None}, "3 full, and 6: 3 publishes after it"
    assert sizes[3] == sizes[6] == full and all(0 < sizes[s] < full / 2 for s in (2, 4, 5)), sizes


class Recording(ChainReader):
    """A `ChainReader` that notes the steps it read."""

    def __init__(self, location: str):
        super().__init__(location, timeout=30)
        self.steps = []

    def first(self, step):
        self.steps.append(step)
        return super().first(step)

    def read(self, step):
        self.steps.append(step)
        return super().read(step)


def test_a_replica_on_another_continuation_of_the_same_step_reloads_from_a_full_snapshot(tmp_path, model_dir):
    """A trainer that resumes from step 1 publishes its own step 2 and 3: a replica still
    holding the abandoned run's step 2 must not take 3 as a delta over it."""
    training, replica = Training(), PolicyReplica()
    first = make_publisher(WeightTransferConfig(url=str(tmp_path / "a"), delta={}), tmp_path, str(model_dir))
    resumed = make_publisher(WeightTransferConfig(url=str(tmp_path / "b"), delta={}), tmp_path, str(model_dir))
    one = training.step()
    for step, publisher in ((1, first), (2, first)):
        reader = Recording(publisher.publish(training.step() if step == 2 else one, step))
        replica.update(reader.first(step), reader.read)
    resumed.republish(one, 1)
    policies = {step: training.step() for step in (2, 3)}
    locations = {step: resumed.publish(policies[step], step) for step in (2, 3)}
    reader = Recording(locations[3])
    assert_bit_exact(replica.update(reader.first(3), reader.read), policies[3])
    assert reader.steps == [3, 2], "after a resume the first publish is a full one"
    assert json.loads((tmp_path / "b" / "step_3" / "COMPLETE").read_text())["base"] == 2
    assert not (tmp_path / "b" / "step_2" / DELTA_FILE).exists()


def test_a_lora_run_refuses_deltas(tmp_path, model_dir):
    with pytest.raises(ValueError, match="weights.delta"):
        make_publisher(WeightTransferConfig(delta={}), tmp_path, str(model_dir), adapter_config={"r": 8})
