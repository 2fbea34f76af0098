"""The Rollouts gRPC service over loopback: bit-exact batches, per-rank delivery, retries."""

import asyncio
import threading
import time

import pytest
import torch
from rlkube.transport.client import OrchestratorRestarted, RolloutClient, RolloutError
from rlkube.transport.microbatch import TENSOR_FIELDS
from rlkube.transport.server import start_server, stop_server
from rlkube.transport.tensors import from_proto, to_proto

from tests.fixtures.inference import free_port
from tests.fixtures.network import VanishingPeerProxy


def random_micro_batch(rows: int, seq_len: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, 2**62, (rows, seq_len), generator=g),
        "position_ids": torch.randint(0, seq_len, (rows, seq_len), generator=g),
        "sample_ids": torch.randint(-1, 100, (rows, seq_len), generator=g, dtype=torch.int32),
        "prefix_ids": torch.randint(-1, 100, (rows, seq_len), generator=g, dtype=torch.int32),
        "loss_mask": torch.rand(rows, seq_len, generator=g) > 0.5,
        # Random bit patterns, NaNs and denormals included: the transport must not touch values.
        "advantages": torch.randint(-(2**31), 2**31 - 1, (rows, seq_len), generator=g, dtype=torch.int32).view(torch.float32),
        "inference_logprobs": -torch.rand(rows, seq_len, generator=g) * 10,
        "temperatures": torch.full((rows, seq_len), 0.7),
        "global_loss_tokens": 12345,
    }


class FakeSource:
    """Per (step, rank): 3 micro-batches; step 99 is a bad request; reports are recorded."""

    def __init__(self, instance_id="orchestrator-a"):
        self.instance_id = instance_id
        self.batches = {(1, r): [random_micro_batch(2, 64, 10 * r + i) for i in range(3)] for r in range(2)}
        self.reports, self.requests = [], []

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        self.requests.append(step)
        if step == 99:
            raise ValueError("step 99 is past max_steps")
        await asyncio.sleep(0.05)  # the batch is "not ready yet" for a moment
        if (step, rank) not in self.batches:
            await asyncio.Event().wait()  # a restarted orchestrator: this step never comes
        return self.batches[(step, rank)]

    async def report_policy(self, step, location):
        self.reports.append((step, location))
        return step

    def status(self):
        return {"phase": "running", "step": 1, "max_steps": 5, "reward": None, "policy_step": 0}


class ServerThread:
    """The aio server on its own loop in a thread, as the orchestrator process would run it."""

    def __init__(self, source, port, delay_s=0.0):
        self.source, self.port, self.delay_s = source, port, delay_s
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.stopping = None

    async def _main(self):
        await asyncio.sleep(self.delay_s)
        self.stopping = asyncio.Event()
        server = await start_server(self.source, "127.0.0.1", self.port)
        self.ready.set()
        await self.stopping.wait()
        await stop_server(server, grace_s=1)

    def __enter__(self):
        self.thread.start()
        if not self.delay_s:  # a delayed server is one the client must wait for; any other is up
            self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.ready.wait(10)
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 5).to(torch.bfloat16),
        torch.tensor([float("nan"), float("-inf"), -0.0, 1e-45]),
        torch.tensor([True, False, True]),
        torch.zeros(0, 4, dtype=torch.int64),
        torch.tensor(7, dtype=torch.int16),
    ],
)
def test_tensor_codec_is_bit_exact(tensor):
    message = to_proto(tensor)
    assert len(message.data) == tensor.numel() * tensor.element_size()
    assert_bit_equal(from_proto(message), tensor)


def test_tensor_codec_rejects_wrong_byte_count():
    message = to_proto(torch.arange(4))
    message.data = message.data[:-1]
    with pytest.raises(ValueError, match="needs 32 bytes, got 31"):
        from_proto(message)


def test_batch_round_trip_is_bit_exact_per_rank():
    source, port = FakeSource(), free_port()
    with ServerThread(source, port), RolloutClient(f"127.0.0.1:{port}", timeout_s=30) as client:
        for rank in range(2):
            got = client.get_batch(step=1, rank=rank, world_size=2, micro_batch_rows=2)
            sent = source.batches[(1, rank)]
            assert [m["index"] for m in got] == [0, 1, 2] and {m["count"] for m in got} == {3}
            for g, s in zip(got, sent):
                for name in TENSOR_FIELDS:
                    assert_bit_equal(g[name], s[name])
                assert g["global_loss_tokens"] == 12345 and g["step"] == 1
        assert client.report_policy(1, "/tmp/w/step_1") == 1
        assert source.reports == [(1, "/tmp/w/step_1")]
        status = client.status()
        assert (status.phase, status.policy_step, status.has_reward) == ("running", 0, False)


def test_client_retries_until_the_server_comes_up():
    source, port = FakeSource(), free_port()
    start = time.monotonic()
    with ServerThread(source, port, delay_s=1.0), RolloutClient(f"127.0.0.1:{port}", timeout_s=30, backoff_s=0.1) as client:
        assert len(client.get_batch(step=1, rank=0, world_size=2)) == 3
    assert time.monotonic() - start >= 1.0


def test_bad_request_fails_at_once_with_the_reason():
    source, port = FakeSource(), free_port()
    with (
        ServerThread(source, port),
        RolloutClient(f"127.0.0.1:{port}", timeout_s=30) as client,
        pytest.raises(RolloutError, match="INVALID_ARGUMENT: step 99 is past max_steps"),
    ):
        client.get_batch(step=99, rank=0, world_size=1)


def test_deadline_when_nobody_answers():
    with (
        RolloutClient(f"127.0.0.1:{free_port()}", timeout_s=0.5, backoff_s=0.1) as client,
        pytest.raises(RolloutError, match="no answer within|deadline"),
    ):
        client.get_batch(step=1, rank=0, world_size=1)


def test_an_answer_from_a_restarted_orchestrator_stops_the_trainer():
    """Orchestrator A serves step 1; B (a restart, back at its checkpoint, without step 2)
    takes over the port. The trainer's next call fails at once instead of waiting for a batch
    that will never come, and a trainer that reconnects through a retry is stopped too."""
    port = free_port()
    with RolloutClient(f"127.0.0.1:{port}", timeout_s=120, backoff_s=0.1) as client:
        with ServerThread(FakeSource("orchestrator-a"), port):
            assert len(client.get_batch(step=1, rank=0, world_size=2)) == 3
            assert client.report_policy(1, "/w/step_1") == 1
        restarted = FakeSource("orchestrator-b")
        with ServerThread(restarted, port):
            with pytest.raises(OrchestratorRestarted, match="orchestrator-b, not orchestrator-a"):
                client.get_batch(step=2, rank=0, world_size=2)
            with pytest.raises(OrchestratorRestarted):
                client.report_policy(2, "/w/step_2")
            with pytest.raises(OrchestratorRestarted):
                client.status()
        assert restarted.reports == [], "nothing reported to the new orchestrator"

    with RolloutClient(f"127.0.0.1:{port}", timeout_s=120, backoff_s=0.1) as client:
        with ServerThread(FakeSource("orchestrator-a"), port):
            client.get_batch(step=1, rank=1, world_size=2)
        # Nobody listens for a second: the call retries, and reaches B when it comes up.
        with ServerThread(FakeSource("orchestrator-b"), port, delay_s=1.0), pytest.raises(OrchestratorRestarted):
            client.get_batch(step=1, rank=1, world_size=2)


def test_a_get_batch_broken_by_a_restart_reaches_the_new_orchestrator_and_stops():
    """The trainer waits in GetBatch(2) when orchestrator A stops; its retry reaches B."""
    port, outcome = free_port(), {}
    with RolloutClient(f"127.0.0.1:{port}", timeout_s=120, backoff_s=0.1) as client:
        first = ServerThread(FakeSource("orchestrator-a"), port)
        with first:
            client.get_batch(step=1, rank=0, world_size=2)

            def wait_for_step_2():
                try:
                    client.get_batch(step=2, rank=0, world_size=2)  # A never has step 2
                except Exception as e:  # noqa: BLE001 - the outcome is the assertion
                    outcome["error"] = e

            waiting = threading.Thread(target=wait_for_step_2)
            waiting.start()
            while 2 not in first.source.requests:  # the call is in flight on A
                time.sleep(0.05)
        with ServerThread(FakeSource("orchestrator-b"), port):
            waiting.join(60)
    assert isinstance(outcome.get("error"), OrchestratorRestarted), outcome


def test_a_get_batch_on_an_orchestrator_that_vanishes_reaches_its_replacement(short_keepalive):
    """The orchestrator's pod is gone (no reset reaches the trainer): keepalive ends the waiting
    GetBatch within seconds, and the retry reaches the replacement behind the same address."""
    old_port, new_port, outcome = free_port(), free_port(), {}
    proxy = VanishingPeerProxy(old_port)
    try:
        with RolloutClient(f"127.0.0.1:{proxy.port}", timeout_s=120, backoff_s=0.1) as client:
            first = ServerThread(FakeSource("orchestrator-a"), old_port)
            with first, ServerThread(FakeSource("orchestrator-b"), new_port):
                client.get_batch(step=1, rank=0, world_size=2)

                def wait_for_step_2():
                    try:
                        client.get_batch(step=2, rank=0, world_size=2)
                    except Exception as e:  # noqa: BLE001 - the outcome is the assertion
                        outcome["error"] = e

                waiting = threading.Thread(target=wait_for_step_2)
                waiting.start()
                while 2 not in first.source.requests:
                    time.sleep(0.05)
                proxy.vanish_and_point_to(new_port)
                waiting.join(60)
    finally:
        proxy.close()
    assert isinstance(outcome.get("error"), OrchestratorRestarted), outcome
