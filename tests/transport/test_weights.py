"""Weight publishing without vLLM: the snapshot format, storage (local and S3) and gRPC."""

import json
import threading
import time
from pathlib import Path

import grpc
import pytest
import torch
from rlkube.config import WeightTransferConfig
from rlkube.transport.publishers import make_publisher
from rlkube.transport.rlkube_pb2 import WeightsChunk, WeightsRequest
from rlkube.transport.weights import GrpcPublisher, StoragePublisher
from rlkube.transport.weights_grpc import (
    WeightsServicer,
    fetch_snapshot,
    serve_weights,
)
from rlkube.transport.weights_snapshot import (
    COMPLETE,
    Snapshot,
    iter_safetensors,
)
from rlkube.transport.weights_storage import (
    list_steps,
    local_snapshot,
    prune,
    read_marker,
    write_snapshot,
)
from safetensors.torch import load, save

from tests.fixtures.inference import S3_BUCKET, S3_ENV, free_port
from tests.fixtures.network import VanishingPeerProxy


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (directory / "tokenizer.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"not copied")
    return directory


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(16, 8, generator=g)
    return {"embed.weight": embed, "lm_head.weight": embed, "norm.weight": torch.randn(8, generator=g)}


def test_snapshot_is_bit_exact_with_config_and_marker_last(model_dir):
    files = Snapshot(state(), 3, model_dir).files()
    assert list(files)[-1] == COMPLETE
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(files)
    assert files["model.safetensors"] != b"not copied"
    marker = json.loads(files[COMPLETE])
    assert marker["step"] == 3 and "model.safetensors" in marker["files"]
    loaded = dict(iter_safetensors(files))
    for name, tensor in state().items():  # tied tensors are stored twice, values intact
        assert torch.equal(loaded[name], tensor)


def test_tensors_of_a_fetched_snapshot_are_views_of_its_buffer_in_every_dtype():
    tensors = {
        "bf16": torch.randn(3, 4).bfloat16(), "half": torch.randn(7).half(), "long": torch.arange(5),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "mask": torch.tensor([True, False]),
    }
    loaded = dict(iter_safetensors({"model.safetensors": bytearray(save(tensors))}))
    assert all(loaded[k].dtype == v.dtype and torch.equal(loaded[k], v) for k, v in tensors.items())

    buffer = bytearray(save({"w": torch.ones(4)}))  # as fetch_snapshot returns a file
    (weights,) = dict(iter_safetensors({"model.safetensors": buffer})).values()
    buffer[-4:] = torch.tensor([7.0]).numpy().tobytes()
    assert weights.tolist() == [1, 1, 1, 7], "a view of the fetched bytes, not a copy"


def test_large_state_dicts_are_sharded_with_an_index(model_dir):
    files = Snapshot(state(), 1, model_dir, max_shard_bytes=300).files()
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert len(shards) > 1
    index = json.loads(files["model.safetensors.index.json"])
    assert set(index["weight_map"]) == set(state())
    for name, shard in index["weight_map"].items():
        assert name in load(bytes(files[shard]))


def test_storage_writes_the_same_bytes_as_the_in_memory_snapshot(tmp_path, model_dir):
    """Storage streams each shard to its file (no bytes copy of the model first); gRPC holds the
    files in memory: both must be the same snapshot."""
    snapshot = Snapshot(state(), 4, model_dir, max_shard_bytes=300)
    location = write_snapshot(str(tmp_path / "weights"), snapshot)
    on_disk = {path.name: path.read_bytes() for path in (tmp_path / "weights" / "step_4").iterdir()}
    assert location.endswith("step_4") and on_disk == snapshot.files()


def test_model_dir_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Snapshot(state(), 1, tmp_path)


def test_storage_publish_marks_complete_and_prunes(tmp_path, model_dir):
    root = tmp_path / "weights"
    publisher = make_publisher(WeightTransferConfig(keep_last=2), tmp_path, str(model_dir))
    assert isinstance(publisher, StoragePublisher)
    locations = [publisher.publish(state(step), step) for step in (1, 2, 3)]
    assert locations[-1] == str(root / "step_3")
    assert list_steps(str(root)) == {2: True, 3: True}
    with local_snapshot(locations[-1]) as path:
        loaded = load((root / "step_3" / "model.safetensors").read_bytes())
        assert path == locations[-1] and torch.equal(loaded["norm.weight"], state(3)["norm.weight"])


def test_partial_snapshot_is_refused_and_cleaned_up(tmp_path, model_dir):
    root = str(tmp_path / "weights")
    write_snapshot(root, Snapshot(state(), 1, model_dir))
    partial = tmp_path / "weights" / "step_2"  # a crash mid-publish: files but no marker
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    with pytest.raises(FileNotFoundError, match="incomplete"):
        read_marker(str(partial))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_marker(str(tmp_path / "weights" / "step_9"))
    write_snapshot(root, Snapshot(state(), 3, model_dir))
    assert prune(root, keep_last=None) == [2]
    assert list_steps(root) == {1: True, 3: True}


def test_republish_on_resume_drops_newer_snapshots_and_keeps_a_complete_one(tmp_path, model_dir):
    root = tmp_path / "weights"
    publisher = StoragePublisher(str(root), str(model_dir), keep_last=2)
    for step in (1, 2, 3, 4):
        publisher.publish(state(step), step)
    assert list_steps(str(root)) == {3: True, 4: True}  # step 2 was pruned

    publisher.republish(state(2), 2)  # resuming from step 2's checkpoint
    assert list_steps(str(root)) == {2: True}, "snapshots of the abandoned steps 3 and 4 are gone"
    snapshot = root / "step_2" / "model.safetensors"
    assert torch.equal(load(snapshot.read_bytes())["norm.weight"], state(2)["norm.weight"])

    written = snapshot.stat().st_mtime_ns
    publisher.republish(state(99), 2)  # complete already: inference may be reading it, untouched
    assert snapshot.stat().st_mtime_ns == written
    assert torch.equal(load(snapshot.read_bytes())["norm.weight"], state(2)["norm.weight"])


def test_loading_waits_for_a_snapshot_still_being_published(tmp_path, model_dir):
    root = str(tmp_path / "weights")
    location = str(tmp_path / "weights" / "step_1")
    with pytest.raises(FileNotFoundError, match="does not exist"), local_snapshot(location, timeout_s=0.3):
        pass
    writer = threading.Timer(0.5, write_snapshot, (root, Snapshot(state(1), 1, model_dir)))
    writer.start()
    try:
        with local_snapshot(location, timeout_s=30) as path:
            assert (tmp_path / "weights" / "step_1" / COMPLETE).is_file() and path == location
    finally:
        writer.join()


def test_storage_on_s3_round_trip(moto_s3, monkeypatch, model_dir):
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": moto_s3}.items():
        monkeypatch.setenv(key, value)
    url = f"s3://{S3_BUCKET}/unit/weights"
    publisher = StoragePublisher(url, str(model_dir), keep_last=1)
    publisher.publish(state(1), 1)
    location = publisher.publish(state(2), 2)
    assert location == f"{url}/step_2"
    assert list_steps(url) == {2: True}
    with local_snapshot(location) as path:  # downloaded to a local temporary directory
        assert not path.startswith("s3://")
        with open(f"{path}/model.safetensors", "rb") as f:
            assert torch.equal(load(f.read())["norm.weight"], state(2)["norm.weight"])


def test_an_object_store_gets_each_shard_streamed_with_safetensors_own_bytes(moto_s3, monkeypatch, model_dir):
    """Sharded, to an object store: the files are byte for byte what safetensors makes, written
    from the tensors' memory in pieces (a shard's whole bytes are never built: `save` is not
    called), in a layout of every dtype, a scalar and an empty tensor."""
    import safetensors.torch

    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": moto_s3}.items():
        monkeypatch.setenv(key, value)
    tensors = {
        **state(3), "bf16": torch.randn(5, 3).bfloat16(), "long": torch.arange(7), "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 4), "mask": torch.tensor([True, False]),
    }
    expected = Snapshot(tensors, 4, model_dir, max_shard_bytes=300).files()
    monkeypatch.setattr("rlkube.transport.weights_snapshot.WRITE_BYTES", 100)
    monkeypatch.setattr(safetensors.torch, "save", lambda *a, **k: pytest.fail("a shard was serialized whole"))
    url = f"s3://{S3_BUCKET}/streamed/weights"
    location = write_snapshot(url, Snapshot(tensors, 4, model_dir, max_shard_bytes=300))
    with local_snapshot(location) as path:
        shards = sorted(p.name for p in Path(path).glob("*.safetensors"))
        assert len(shards) > 1
        for name in shards:
            assert (Path(path) / name).read_bytes() == expected[name], name


def test_grpc_publish_and_fetch(model_dir):
    config = WeightTransferConfig(type="grpc", grpc_port=free_port(), keep_last=1)
    publisher = make_publisher(config, "unused", str(model_dir))
    assert isinstance(publisher, GrpcPublisher)
    try:
        big = {"w": torch.randn(3 * 1024 * 1024)}  # 12 MiB: more than one chunk
        location = publisher.publish(big, 1)
        assert location == f"grpc://127.0.0.1:{config.grpc_port}"
        publisher.publish(state(2), 2)
        address = location.removeprefix("grpc://")
        files = fetch_snapshot(address, 2, timeout=30)
        assert files == Snapshot(state(2), 2, model_dir).files()
        assert fetch_snapshot(address, -1, timeout=30) == files
        with pytest.raises(ConnectionError, match="NOT_FOUND"):
            fetch_snapshot(address, 1, timeout=30)  # pruned by keep_last=1
        with pytest.raises(ConnectionError, match=r"NOT_FOUND.*held: \[2\]"):
            fetch_snapshot(address, 99, timeout=4)  # never published by this trainer: refused
    finally:
        publisher.close()


def test_grpc_serves_a_held_snapshot_and_reuses_its_buffers_only_once_no_fetch_sends_them(model_dir, monkeypatch):
    """Chunks are encoded per Fetch from the held files (here 100-byte chunks: many per file,
    lengths over one varint byte); a dropped snapshot's buffer goes to the next publish, but not
    while a Fetch is still sending it, which then sends the bytes it started with."""
    monkeypatch.setattr("rlkube.transport.weights_grpc.CHUNK_BYTES", 300)
    publisher = GrpcPublisher("127.0.0.1", free_port(), str(model_dir), keep_last=1)
    servicer = publisher.servicer
    try:
        publisher.publish(state(1), 1)
        expected = Snapshot(state(1), 1, model_dir).files()
        assert fetch_snapshot(publisher.address, 1, timeout=30) == expected
        size = len(expected["model.safetensors"])

        class Context:
            def time_remaining(self):
                return None

        sending = servicer.Fetch(WeightsRequest(step=1), Context())
        first = next(sending)
        publisher.publish(state(2), 2)  # step 1 is dropped while that Fetch still sends it
        fresh = servicer.buffer(size)
        chunks = [WeightsChunk.FromString(first), *map(WeightsChunk.FromString, sending)]
        files = {}
        for chunk in chunks:
            files[chunk.file] = files.get(chunk.file, b"") + chunk.data
        assert files == expected, "the Fetch sent step 1's bytes to its end"
        reused = servicer.buffer(size)
        assert reused is not fresh and bytes(reused) == expected["model.safetensors"], "step 1's buffer, now spare"
    finally:
        publisher.close()


def test_a_fetch_dials_afresh_and_does_not_wait_for_its_channel_to_close(model_dir, monkeypatch):
    """Closing a channel that waited for readiness takes ~0.2 s with grpcio 1.85: each load
    paid it (a NIXL load twice) until the close moved off the fetch's thread. Here a close takes
    3 s; three fetches must not take it. Each fetch still dials afresh: a trainer's replacement
    behind the same name is at a new address, and a kept connection to a vanished pod waited
    for keepalive to give it up."""
    opened = []

    def slow_close(channel):
        time.sleep(3)
        real_close(channel)

    insecure_channel = grpc.insecure_channel
    monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **k: opened.append(a[0]) or insecure_channel(*a, **k))
    probe = insecure_channel("127.0.0.1:1")  # grpcio's Channel class (grpc._channel is private)
    channel_type, real_close = type(probe), type(probe).close
    probe.close()
    monkeypatch.setattr(channel_type, "close", slow_close)
    files = Snapshot(state(1), 1, model_dir).files()
    servicer = WeightsServicer(keep_last=None)
    servicer.add(1, files)
    address = f"127.0.0.1:{free_port()}"
    server = serve_weights(servicer, address)
    try:
        started = time.monotonic()
        for _ in range(3):
            assert fetch_snapshot(address, 1, timeout=30) == files
        took = time.monotonic() - started
    finally:
        server.stop(0).wait()
    assert took < 3, f"three fetches took {took:.1f} s: they waited for their channels to close"
    assert opened == [address] * 3


def test_grpc_server_binds_one_address_and_advertises_another(model_dir):
    """In a pod the server binds every interface and inference dials the trainer's Service
    name: the location names `grpc_host`, and fetching through that name works."""
    config = WeightTransferConfig(type="grpc", grpc_host="localhost", grpc_bind_host="127.0.0.1", grpc_port=free_port())
    publisher = make_publisher(config, "unused", str(model_dir))
    try:
        location = publisher.publish(state(1), 1)
        assert location == f"grpc://localhost:{config.grpc_port}"
        assert fetch_snapshot(location.removeprefix("grpc://"), 1, timeout=30) == Snapshot(state(1), 1, model_dir).files()
    finally:
        publisher.close()
    taken = WeightTransferConfig(type="grpc", grpc_host="localhost", grpc_bind_host="192.0.2.1", grpc_port=free_port())
    with pytest.raises(OSError, match="weights.grpc_bind_host"):
        make_publisher(taken, "unused", str(model_dir))  # not an address of this machine


def test_grpc_fetch_waits_for_the_server_and_the_step_it_resumes_from(model_dir):
    """A resumed run asks for its checkpoint's policy before the trainer serves it."""
    config = WeightTransferConfig(type="grpc", grpc_port=free_port(), keep_last=2)
    publishers = []

    def start_then_publish():
        publishers.append(make_publisher(config, "unused", str(model_dir)))
        publishers[0].expect(1)  # as the trainer does once it found checkpoint 1
        time.sleep(0.5)
        publishers[0].republish(state(1), 1)

    starter = threading.Timer(0.5, start_then_publish)
    started = time.monotonic()
    starter.start()
    try:
        files = fetch_snapshot(f"127.0.0.1:{config.grpc_port}", 1, timeout=30)
        assert files == Snapshot(state(1), 1, model_dir).files()
        assert time.monotonic() - started >= 1.0
    finally:
        starter.join()
        for publisher in publishers:
            publisher.close()


def fetch_in_background(address: str, step: int, timeout: float) -> tuple[threading.Thread, dict]:
    """`fetch_snapshot` in a started thread; the dict gets its `ConnectionError` as "error"."""
    outcome = {}

    def fetch():
        try:
            fetch_snapshot(address, step, timeout=timeout)
        except ConnectionError as e:
            outcome["error"] = e

    waiting = threading.Thread(target=fetch)
    waiting.start()
    return waiting, outcome


def test_a_fetch_from_a_trainer_that_vanishes_mid_call_fails_instead_of_waiting(model_dir, short_keepalive):
    """A replica waits on step 2 (the checkpoint a resumed trainer republishes) when the
    trainer's pod dies (no reset reaches it): keepalive ends the load within seconds, freeing
    the engine, instead of at the 60 s deadline."""
    port = free_port()
    publisher = make_publisher(WeightTransferConfig(type="grpc", grpc_port=port), "unused", str(model_dir))
    proxy = VanishingPeerProxy(port)
    try:
        publisher.expect(2)
        waiting, outcome = fetch_in_background(f"127.0.0.1:{proxy.port}", 2, timeout=60)
        time.sleep(1)  # the call waits on the trainer for step 2
        proxy.vanish_and_point_to(free_port())
        started = time.monotonic()
        waiting.join(40)
        assert not waiting.is_alive(), "the fetch still waits on the vanished trainer"
        assert "UNAVAILABLE" in str(outcome.get("error")), outcome
        print(f"load failed {time.monotonic() - started:.1f} s after the trainer vanished")
    finally:
        publisher.publish(state(2), 2)  # ends the server's wait for the step
        proxy.close()
        publisher.close()


def test_a_fetch_from_a_replacement_trainer_is_refused_at_once_not_at_its_deadline(model_dir):
    """The ten-minute stall of a healed run. The trainer that reported policy 1 dies while a
    replica is about to fetch it, and its replacement (a gang restart, no checkpoint yet) comes
    up behind the same address. The fetch used to wait on the replacement for step 1 until the
    load's deadline, while the replacement needed rollouts from that replica's engine, held by
    this very load, to train it. It is refused at once now, and the orchestrator retries."""
    port = free_port()
    config = WeightTransferConfig(type="grpc", grpc_port=port)
    first = make_publisher(config, "unused", str(model_dir))
    first.publish(state(1), 1)
    first.close()
    replacement = make_publisher(config, "unused", str(model_dir))
    started = time.monotonic()
    waiting, outcome = fetch_in_background(f"127.0.0.1:{port}", 1, timeout=120)
    try:
        waiting.join(30)  # a quarter of the deadline: only the timeout path takes longer
        assert not waiting.is_alive(), "the fetch waits on the replacement trainer for a step it will not publish"
        assert "NOT_FOUND" in str(outcome.get("error")), outcome
        print(f"refused after {time.monotonic() - started:.1f} s")
    finally:
        replacement.publish(state(1), 1)  # ends a wait of the old code's server
        waiting.join()
        replacement.close()


def test_a_fetch_from_an_address_where_no_trainer_answers_gives_up_dialling(monkeypatch):
    """A trainer pod that is gone, and not (yet) replaced: the fetch gives up after
    `CONNECT_TIMEOUT_S` (2 s here rather than its 15, which the test would only wait out), not at
    its deadline, freeing the engine; the orchestrator retries."""
    monkeypatch.setattr("rlkube.transport.weights_grpc.CONNECT_TIMEOUT_S", 2.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no weight server answered at grpc://127.0.0.1:\d+ within 1s"):
        fetch_snapshot(f"127.0.0.1:{free_port()}", 1, timeout=1)
    with pytest.raises(ConnectionError, match=r"within 2s"):
        fetch_snapshot(f"127.0.0.1:{free_port()}", 1, timeout=600)
    assert time.monotonic() - started < 120


def test_rl_config_gives_nccl_the_replica_urls():
    from rlkube.config import RLConfig

    config = RLConfig.model_validate({"weights": {"type": "nccl"}, "inference": {"replicas": 2, "port": 9000}})
    trainer = config.process_configs()["trainer"]
    assert trainer.weights.inference_urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"]
    storage = RLConfig.model_validate({}).process_configs()["trainer"]
    assert storage.weights.inference_urls == []
