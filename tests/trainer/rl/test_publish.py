"""Publishing off the critical path: the real RL trainer on the tiny model, fed over real gRPC,
publishing through the real storage and gRPC publishers in the background."""

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.publish import PolicyPublishing
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient
from rlkube.transport.publishers import make_publisher
from rlkube.transport.weights import WeightPublisher
from rlkube.transport.weights_delta import ChainReader, PolicyReplica
from rlkube.transport.weights_grpc import fetch_snapshot
from rlkube.transport.weights_snapshot import COMPLETE, iter_safetensors

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_trainer import (
    SEQ_LEN,
    RecordingMetrics,
    Server,
    SyntheticSource,
    synthetic_batch,
)


class NoOrchestrator:
    """A client for publishes that nothing reads the reports of."""

    def report_policy(self, step, location):
        return step


class GatedPublisher(WeightPublisher):
    """`inner`, but the publish of each step in `gates` waits until its gate is opened."""

    def __init__(self, inner: WeightPublisher, gates: dict[int, threading.Event] | None = None):
        self.inner, self.gates = inner, gates or {}
        self.started: list[int] = []

    def publish(self, state_dict, step):
        self.started.append(step)
        if step in self.gates:
            assert self.gates[step].wait(60), f"publish {step} was never released"
        return self.inner.publish(state_dict, step)

    def republish(self, state_dict, step):
        self.inner.republish(state_dict, step)

    def close(self):
        self.inner.close()


def trainer_config(tiny_model, tmp_path, **weights) -> TrainerConfig:
    return TrainerConfig(
        output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=3, device="cpu", optim={"lr": 3e-3},
        loss={"kl_tau": 0.0}, rollouts={"port": free_port(), "timeout_s": 60},
        weights={"grpc_port": free_port(), **weights},
    )


def make_trainer(config: TrainerConfig, publisher: WeightPublisher, client=None) -> RLTrainer:
    client = client or RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=60)
    return RLTrainer(config, build_training_env(config), client, publisher, None, RecordingMetrics())


def batch_for(trainer) -> dict:
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, batch)[0].float()
    return batch


def weight_files(location: str, step: int) -> dict[str, bytes]:
    """The safetensors of published `step`, as inference reads them."""
    if location.startswith("grpc://"):
        files = fetch_snapshot(location.removeprefix("grpc://"), step, timeout=30)
    else:
        files = {"model.safetensors": (Path(location) / "model.safetensors").read_bytes()}
    return {name: bytes(data) for name, data in files.items() if name.endswith(".safetensors")}


@pytest.mark.parametrize("transport", ["storage", "grpc"])
def test_an_overlapped_publish_is_bit_exact_while_the_next_step_changes_the_weights(tiny_model, tmp_path, world_of_one,
                                                                                    transport):
    """Policy N's writer is held back until step N+1's optimizer step has changed every weight;
    what it publishes must still be, byte for byte, a synchronous publish of policy N taken just
    before that optimizer step."""
    config = trainer_config(tiny_model, tmp_path / "overlapped", type=transport, keep_last=None)
    gates = {1: threading.Event(), 2: threading.Event()}
    inner = make_publisher(config.weights, config.output_dir, config.model.name)
    trainer = make_trainer(config, GatedPublisher(inner, gates))
    reference_config = config.weights.model_copy(update={"type": "storage"})
    reference = make_publisher(reference_config, tmp_path / "reference", config.model.name)
    reference_publishing = PolicyPublishing(reference, NoOrchestrator(), torch.float32, is_main=True, overlap=False)

    real_optimizer_step = trainer.optimizer_step
    changed = []

    def optimizer_step_then_release_the_previous_writer():
        step = trainer.step  # the policy the weights are now
        if step > 0:
            reference_publishing.publish(step, trainer.env.policy_tensors())
        before = {k: v.clone() for k, v in trainer.env.full_state_dict().items()}
        grad_norm = real_optimizer_step()
        after = trainer.env.full_state_dict()
        changed.append(sum(not torch.equal(before[k], after[k]) for k in before))
        if step in gates:
            gates[step].set()
        return grad_norm

    trainer.optimizer_step = optimizer_step_then_release_the_previous_writer
    source = SyntheticSource(batch_for(trainer))
    try:
        with Server(source, config.rollouts.port):
            trainer.train()
        reference_publishing.publish(3, trainer.env.policy_tensors())
        assert [s for s, _ in source.reports] == [1, 2, 3]
        assert trainer.metrics.records[3]["time/publish_background"] > 0, "policy 2's publish, timed"
        assert min(changed) == len(trainer.env.full_state_dict()), "each optimizer step changes every weight"
        for step, location in source.reports:
            expected = weight_files(str(tmp_path / "reference" / "weights" / f"step_{step}"), step)
            assert weight_files(location, step) == expected, f"policy {step}"
    finally:
        trainer.close()
        inner.close()


class CountingPublisher(WeightPublisher):
    def __init__(self):
        self.published, self.fail_at = {}, None

    def publish(self, state_dict, step):
        if step == self.fail_at:
            raise OSError(f"disk full while writing policy {step}")
        self.published[step] = {k: v.clone() for k, v in state_dict.items()}
        return f"memory://{step}"


def test_at_most_one_publish_is_in_flight(tiny_model, tmp_path, world_of_one):
    """The snapshot of policy N+1 waits for policy N's publish: it overwrites the same buffers."""
    config = trainer_config(tiny_model, tmp_path)
    gate = threading.Event()
    trainer = make_trainer(config, GatedPublisher(CountingPublisher(), {1: gate}), NoOrchestrator())
    trainer.publish_policy(1)
    policy_1 = {k: v.clone() for k, v in trainer.env.full_state_dict().items()}
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    second = threading.Thread(target=trainer.publish_policy, args=(2,))
    second.start()
    second.join(1.0)
    assert second.is_alive(), "publishing policy 2 waits while policy 1 is in flight"
    assert trainer.publishing.publisher.started == [1]
    gate.set()
    second.join(30)
    assert not second.is_alive()
    trainer.close()
    published = trainer.publishing.publisher.inner.published
    assert all(torch.equal(published[1][k], policy_1[k]) for k in published[1]), "policy 1 was not overwritten"
    assert all(torch.equal(published[2][k], policy_1[k] + 1) for k in published[2])


def test_a_background_publish_failure_stops_the_trainer(tiny_model, tmp_path, world_of_one):
    """Policy 1's write fails while step 2 computes: the trainer raises it before it publishes
    policy 2, and trains no further step."""
    config = trainer_config(tiny_model, tmp_path)
    failing = CountingPublisher()
    failing.fail_at = 1
    trainer = make_trainer(config, failing)
    source = SyntheticSource(batch_for(trainer))
    with Server(source, config.rollouts.port), pytest.raises(OSError, match="disk full while writing policy 1"):
        trainer.train()
    assert trainer.step == 2 and source.reports == [], "raised at step 2's publish, policy 1 never reported"
    trainer.close()  # nothing in flight any more; the error is not raised twice


@pytest.mark.parametrize(("model_dtype", "wire", "expected"), [
    ("float32", "auto", torch.float32),
    ("bfloat16", "auto", torch.bfloat16),
    ("bfloat16", "float32", torch.float32),
    ("float32", "bfloat16", torch.bfloat16),
])
@pytest.mark.parametrize("overlap", [True, False])
def test_weights_reach_the_files_in_the_wire_dtype(tiny_model, tmp_path, world_of_one, model_dtype, wire, expected,
                                                   overlap):
    """`weights.dtype = auto` sends bfloat16 when the trainer computes in bfloat16, float32
    otherwise; an explicit dtype wins. Values are the trainer's weights rounded to it."""
    config = trainer_config(tiny_model, tmp_path, dtype=wire, overlap=overlap)
    config = config.model_copy(update={"model": config.model.model_copy(update={"dtype": model_dtype})})
    trainer = make_trainer(config, make_publisher(config.weights, tmp_path, config.model.name))
    source = SyntheticSource(None)
    with Server(source, config.rollouts.port):
        trainer.publish_policy(1)
        trainer.close()
    assert source.reports == [(1, str(tmp_path / "weights" / "step_1"))]
    files = {"model.safetensors": (tmp_path / "weights" / "step_1" / "model.safetensors").read_bytes()}
    weights = trainer.env.full_state_dict()
    for name, tensor in iter_safetensors(files):
        assert tensor.dtype == expected and torch.equal(tensor, weights[name].to(expected)), name



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (pinned buffers, side-stream copies)")
def test_cuda_snapshots_are_pinned_and_exact_though_the_weights_change_at_once():
    """The device-to-host copies run on a side stream, several buckets deep; the weights are
    changed on the default stream right after `capture` returns: the buffers hold the weights
    as they were, in the wire dtype."""
    from rlkube.trainer.publish import HostSnapshot

    g = torch.Generator(device="cuda").manual_seed(0)
    weights = {f"w{i}": torch.randn(1024, 1024, device="cuda", generator=g) for i in range(12)}
    snapshot = HostSnapshot(torch.bfloat16, is_main=True, bucket_bytes=3 * 1024**2)
    for step in range(3):  # the buffers are reused
        expected = {name: w.to(torch.bfloat16).cpu() for name, w in weights.items()}
        snapshot.capture(weights)
        for w in weights.values():
            w.mul_(-2).add_(1)  # the next optimizer step, queued behind the copies' sources
        snapshot.wait_copied()
        for name, buffer in snapshot.buffers.items():
            assert buffer.is_pinned() and buffer.dtype == torch.bfloat16, name
            assert torch.equal(buffer, expected[name]), (step, name)


class SlowPublisher(CountingPublisher):
    """Takes long enough that the trainer asks for the next batch before the policy is reported."""

    def publish(self, state_dict, step):
        time.sleep(0.5)
        return super().publish(state_dict, step)


def test_a_synchronous_orchestrator_gets_each_policy_while_the_trainer_waits_for_the_next_batch(
    tiny_model, tmp_path, world_of_one
):
    """The real orchestrator with `async_level = 0` makes batch N+1 only from policy N, which
    the trainer reports in the background while it already waits for that batch: no deadlock,
    and every policy reaches inference in order."""
    from rlkube.orchestrator.orchestrator import Orchestrator
    from rlkube.transport.server import start_server, stop_server

    from tests.orchestrator.test_orchestrator import FakePool, FakeRunner, make_config

    config = trainer_config(tiny_model, tmp_path / "trainer")
    orchestrator_config = make_config(tmp_path / "orchestrator", max_steps=3, async_level=0, seq_len=SEQ_LEN)
    pool = FakePool()
    orchestrator = Orchestrator(orchestrator_config, [FakeRunner()], pool, lambda metrics, step: None)

    async def serve():
        server = await start_server(orchestrator, "127.0.0.1", config.rollouts.port, workers=orchestrator.workers)
        try:
            await asyncio.wait_for(orchestrator.run(None), timeout=120)
        finally:
            await stop_server(server, 1)

    serving = threading.Thread(target=asyncio.run, args=(serve(),))
    serving.start()
    trainer = make_trainer(config, SlowPublisher())
    try:
        trainer.train()
    finally:
        trainer.close()
        serving.join(60)
    assert pool.loads == [(step, f"memory://{step}") for step in (1, 2, 3)]
    assert orchestrator.status()["phase"] == "finished" and orchestrator.last_lag == 0


class KeepingPublisher(WeightPublisher):
    """`inner`, keeping a copy of each policy it is given: what a full publish would send."""

    def __init__(self, inner: WeightPublisher):
        self.inner, self.policies = inner, {}

    def publish(self, state_dict, step):
        self.policies[step] = {name: tensor.clone() for name, tensor in state_dict.items()}
        return self.inner.publish(state_dict, step)

    def published_bytes(self, state_dict):
        return self.inner.published_bytes(state_dict)

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("transport", ["storage", "grpc"])
def test_the_trainers_delta_publishes_rebuild_each_policy_bit_exact(tiny_model, tmp_path, world_of_one, transport):
    """`weights.delta` in the background over the trainer's reused buffers: a replica that
    loads every reported policy holds, bit for bit, what a full publish would have sent; the
    trainer's `weights/bytes` shows the full first policy and the smaller delta after it; the
    last step's snapshot is whole, a model directory as it is (the publisher made as `run` makes
    it)."""
    config = trainer_config(tiny_model, tmp_path, type=transport, dtype="bfloat16", delta={"full_every": 10})
    config = config.model_copy(update={"optim": config.optim.model_copy(update={"lr": 1e-6})})
    publisher = KeepingPublisher(make_publisher(config.weights, config.output_dir, config.model.name,
                                                final_step=config.max_steps))
    trainer = make_trainer(config, publisher)
    source, replica = SyntheticSource(batch_for(trainer)), PolicyReplica()
    try:
        with Server(source, config.rollouts.port):
            trainer.train()
        assert [step for step, _ in source.reports] == [1, 2, 3]
        for step, location in source.reports:
            reader = ChainReader(location, timeout=30)
            held = replica.update(reader.first(step), reader.read)
            for name, tensor in publisher.policies[step].items():
                assert torch.equal(held[name].view(torch.int16), tensor.view(torch.int16)), f"policy {step}: {name}"
        full = sum(t.nbytes for t in publisher.policies[3].values())
        sent = {step: trainer.metrics.records[step + 1]["weights/bytes"] for step in (1, 2)}  # overlapped
        assert sent[1] == full and 0 < sent[2] < full / 2, f"bytes sent by policy: {sent}, full {full}"
        assert publisher.inner.last_bytes == full, "the last step went whole"
        last = ChainReader(source.reports[-1][1], timeout=30).first(3)
        assert "base" not in json.loads(bytes(last[COMPLETE])), "the last step's snapshot builds on no other"
    finally:
        trainer.close()
        publisher.close()
