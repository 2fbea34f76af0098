"""The NIXL weight transport without vLLM: descriptors over the authenticated weight server,
READs out of the trainer's registered memory, bit-exact, in one process and between two
network namespaces (two pods)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rlkube import auth
from rlkube.config import WeightTransferConfig
from rlkube.transport.publishers import make_publisher
from rlkube.transport.weights_nixl import NixlPublisher, NixlReceiver

from e2e.localcluster.network import Network, unavailable_reason
from tests.fixtures import prerequisites
from tests.fixtures.inference import free_port
from tests.transport.nixl_peer import state

prerequisites.import_module("nixl_cu12", "nixl-cu12, from the cpu extra")

PEER = Path(__file__).with_name("nixl_peer.py")


def assert_exact(received: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> None:
    assert list(received) == list(sent)
    for name, tensor in sent.items():
        got = received[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name


@pytest.fixture
def publisher():
    publisher = NixlPublisher("127.0.0.1", free_port(), keep_last=2, transports=["tcp"])
    yield publisher
    publisher.close()


def test_a_replica_reads_each_held_step_bit_exact_and_a_dropped_one_is_refused(publisher):
    address = publisher.address
    receiver = NixlReceiver()
    for step in (1, 2, 3):
        assert publisher.publish(state(step), step) == f"nixl://{address}"
    for step in (3, 2):
        got_step, tensors = receiver.receive(address, step, timeout=30)
        assert got_step == step
        assert_exact(tensors, state(step))
    assert receiver.receive(address, -1, timeout=30)[0] == 3, "-1 is the newest"
    with pytest.raises(ConnectionError, match=r"step 1 .*NOT_FOUND.*held: \[2, 3\]"):
        receiver.receive(address, 1, timeout=5)


def cpu_seconds_over(seconds: float) -> float:
    """This process's CPU time (every thread) while it sleeps `seconds`."""
    before = os.times()
    time.sleep(seconds)
    after = os.times()
    return after.user + after.system - before.user - before.system


def test_neither_side_keeps_a_core_busy_once_reads_are_done():
    """NIXL's own progress thread polled UCX without sleeping: a third of a core on an idle
    trainer, and all of one in an inference worker whose trainer had gone, for the engine's
    lifetime. Idle here means the CPU time of this process, not the wall time: a spinning
    thread takes what it gets even on a loaded machine."""
    publisher = NixlPublisher("127.0.0.1", free_port(), keep_last=1, transports=["tcp"])
    receiver = NixlReceiver()
    try:
        assert cpu_seconds_over(2.0) < 0.2, "an idle trainer's agent polls"
        publisher.publish(state(1), 1)
        receiver.receive(publisher.address, 1, timeout=30)
    finally:
        publisher.close()
    assert cpu_seconds_over(2.0) < 0.2, "a replica whose trainer has gone polls"


def test_a_bigger_policy_gets_a_bigger_registered_buffer_on_both_sides(publisher):
    receiver = NixlReceiver()
    publisher.publish(state(1), 1)
    receiver.receive(publisher.address, 1, timeout=30)
    publisher.publish(state(2, rows=4096), 2)
    assert_exact(receiver.receive(publisher.address, 2, timeout=30)[1], state(2, rows=4096))


def test_a_step_republished_while_it_was_read_is_an_error_not_torn_weights(publisher, monkeypatch):
    receiver = NixlReceiver()
    publisher.publish(state(1), 1)
    read = NixlReceiver._read

    def read_then_republish(self, descriptor, deadline, address):
        read(self, descriptor, deadline, address)
        publisher.publish(state(5), 1)  # the trainer resumed from step 1 and rewrote it meanwhile

    monkeypatch.setattr(NixlReceiver, "_read", read_then_republish)
    with pytest.raises(ConnectionError, match="step 1 .* republished while they were read"):
        receiver.receive(publisher.address, 1, timeout=30)
    monkeypatch.undo()
    assert_exact(receiver.receive(publisher.address, 1, timeout=30)[1], state(5))


def test_the_descriptor_needs_the_run_token(monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, "the-run-token")
    publisher = NixlPublisher("127.0.0.1", free_port(), keep_last=1, transports=["tcp"])
    try:
        publisher.publish(state(1), 1)
        assert_exact(NixlReceiver().receive(publisher.address, 1, timeout=30)[1], state(1))
        monkeypatch.setenv(auth.TOKEN_ENV, "another-run")
        with pytest.raises(ConnectionError, match="UNAUTHENTICATED"):
            NixlReceiver().receive(publisher.address, 1, timeout=30)
    finally:
        publisher.close()


def test_config_selects_nixl_and_refuses_what_it_cannot_do(tmp_path):
    config = WeightTransferConfig(type="nixl", grpc_port=free_port(), nixl_transports=["tcp"])
    publisher = make_publisher(config, tmp_path, model_dir=str(tmp_path))
    try:
        assert isinstance(publisher, NixlPublisher)
    finally:
        publisher.close()
    with pytest.raises(ValueError, match="weights.type: 'nixl' sends full weights"):
        make_publisher(config, tmp_path, model_dir=str(tmp_path), adapter_config={"r": 8})
    with pytest.raises(ValueError, match="weights.keep_last"):
        NixlPublisher("127.0.0.1", free_port(), keep_last=None, transports=["tcp"])


@pytest.fixture
def two_pods():
    prerequisites.require(unavailable_reason())
    net = Network()
    try:
        yield net.add_pod(), net.add_pod()
    finally:
        net.close()


def test_between_two_network_namespaces_with_the_run_token(two_pods, tmp_path):
    """The trainer in one pod's namespace, a replica in another's, over UCX's TCP transport:
    what a replica loads equals what the trainer published, bit for bit, twice (the second
    READ reuses both registered buffers), and the bytes came in through its eth0."""
    trainer, replica = two_pods
    port = free_port()
    env = {"PYTHONPATH": ":".join(sys.path), auth.TOKEN_ENV: "pods-token", "PATH": "/usr/bin:/bin"}
    publish = subprocess.Popen(
        ["ip", "netns", "exec", trainer.netns, sys.executable, str(PEER), "publish", trainer.ip, str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert "published 1 2\n" in iter(publish.stdout.readline, ""), "the trainer side did not start"
        out = tmp_path / "received"
        done = subprocess.run(
            ["ip", "netns", "exec", replica.netns, sys.executable, str(PEER), "receive", f"{trainer.ip}:{port}",
             str(out)],
            check=False, capture_output=True, text=True, env=env, timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        publish.stdin.close()
        publish.wait(timeout=30)
    for step in (1, 2):
        assert_exact(torch.load(out / f"step_{step}.pt"), state(step, rows=4096))
    payload = sum(t.numel() * t.element_size() for step in (1, 2) for t in state(step, rows=4096).values())
    assert json.loads((out / "eth0.json").read_text())["rx_bytes"] > payload, "the weights crossed the pod network"
