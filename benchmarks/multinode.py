"""One trainer world of two gloo ranks laid out two ways: one pod with two ranks against two pods
with one rank each, every pod a network namespace of its own on a bridge (as the local cluster
runs pods), torchrun launched as the operator renders the trainer (`--nnodes`, `--node-rank`,
`--master-addr` = pod 0's IP).

    sudo python -m benchmarks.multinode [--steps 6] [--rows 4] [--seq-len 256]

Each rank runs the real `RLTrainer.train_step` (FSDP2 over both ranks, the tiny Qwen3 model of
`rlkube model init` in float32, one intra-op thread, the storage publisher on rank 0, weights
overlapped) on a stub batch source serving every step the same `--rows` micro-batches of one
packed `--seq-len` row (GRPO-shaped groups, `benchmarks/trainer_throughput.py`'s packing). Per
step: its wall time and the bytes each rank sent (FSDP's all-gathers and reduce-scatters, the
statistics' all-reduces and the publish's gather), the trainer's own `time/publish_weights`
(the gather the step waits for) and `time/publish_background` (rank 0 writing the policy). Then,
timed apart: the publish's gather alone (`HostSnapshot.capture` of `policy_tensors()`), a
checkpoint save and a load (`TrainerCheckpointer`, every rank's shards into one directory, as on
a shared claim).

Bytes sent are read from the kernel's counters of the pod's network namespace
(`/proc/self/net/dev`, TCP/IP headers included): a one-rank pod's `eth0` transmit bytes, and half
of `lo`'s for the two-rank pod (its ranks talk over loopback; each sends half). The first step
(warm-up) is left out of the medians. Needs root (network namespaces); every namespace, link and
directory it makes is removed afterwards.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFIX = "rkmn"
SUBNET = "10.252.77"
PORT = 29577
NETNS_ETC = Path("/etc/netns")


def _net_bytes(iface: str) -> int:
    """Transmit bytes of `iface` in this process's network namespace."""
    for line in Path("/proc/self/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() == iface:
            return int(data.split()[8])
    raise RuntimeError(f"no interface {iface} in /proc/self/net/dev")


def worker(args: argparse.Namespace) -> None:
    """One rank: the timed phases, written to `<out>/rank<R>.json`."""
    import torch
    from rlkube.config import TrainerConfig
    from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
    from rlkube.trainer.rl.setup import build_training_env
    from rlkube.trainer.rl.trainer import RLTrainer
    from rlkube.transport.publishers import make_publisher

    from benchmarks.trainer_throughput import TINY, Records, StubSource, step_batches

    torch.set_num_threads(1)
    work = Path(args.out)
    config = TrainerConfig(output_dir=work / "trainer", model={"name": args.model}, device="cpu", max_steps=10**6,
                           weights={"type": "storage", "url": str(work / "weights")}, ckpt={"interval": 10**6})
    env = build_training_env(config)
    main = env.rank == 0
    batches = step_batches("grpo", TINY | {"rows": args.rows, "seq_len": args.seq_len}, env.model.config.vocab_size,
                           seed=env.rank)
    publisher = make_publisher(config.weights, config.output_dir, args.model) if main else None
    records = Records()
    trainer = RLTrainer(config, env, StubSource(batches), publisher, None, records)
    local_ranks = int(os.environ["LOCAL_WORLD_SIZE"])
    iface, share = ("lo", local_ranks) if local_ranks > 1 else ("eth0", 1)

    def timed(fn) -> tuple[float, float]:
        """(seconds, bytes this rank sent) of `fn`, between barriers."""
        env.barrier()
        sent, start = _net_bytes(iface) / share, time.perf_counter()
        fn()
        env.barrier()
        return time.perf_counter() - start, _net_bytes(iface) / share - sent

    steps = [timed(lambda n=n: trainer.train_step(n)) for n in range(1, args.steps + 1)]
    trainer.close()
    publish = [timed(lambda: trainer.publishing.snapshot.capture(env.policy_tensors())) for _ in range(3)]
    checkpointer = TrainerCheckpointer(work / "ckpt", config.ckpt, env.rank)
    save = timed(lambda: checkpointer.save(1, env.model, env.optimizer, env.scheduler))
    load = timed(lambda: checkpointer.load(1, env.model, env.optimizer, env.scheduler))
    timings = {key: statistics.median(records.records[n][key] for n in range(2, args.steps + 1))
               for key in ("time/forward_backward", "time/publish_weights", "time/publish_background")} if main else {}
    result = {"rank": env.rank, "steps": steps[1:], "publish": publish[1:], "save": save, "load": load,
              "timings": timings, "parameters": sum(p.numel() for p in env.model.parameters())}
    (work / f"rank{env.rank}.json").write_text(json.dumps(result))
    if publisher is not None:
        publisher.close()
    env.close()


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


@contextmanager
def pods(count: int):
    """`count` network namespaces on a bridge, each with `eth0` at `SUBNET.<2+i>`, and a hosts
    file naming it by its own hostname, as a pod's does (gloo binds to the address its hostname
    resolves to: the host's `localhost` would leave it on loopback): their names."""
    bridge, names = f"{PREFIX}br", [f"{PREFIX}{i}" for i in range(count)]
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            _ip("netns", "add", name)
            _ip("link", "add", f"{PREFIX}v{i}", "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", f"{PREFIX}v{i}", "master", bridge, "up")
            _ip("-n", name, "addr", "add", f"{SUBNET}.{2 + i}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            (NETNS_ETC / name).mkdir(parents=True)
            (NETNS_ETC / name / "hosts").write_text(f"127.0.0.1\tlocalhost\n{SUBNET}.{2 + i}\t{name}\n")
        yield names
    finally:
        for name in names:
            _ip("netns", "del", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        _ip("link", "del", bridge, check=False)


def run_layout(nodes: int, procs: int, args: argparse.Namespace, model: str, work: Path) -> list[dict]:
    """Two ranks as `nodes` pods x `procs` ranks; each rank's result."""
    out = work / f"out-{nodes}x{procs}"
    out.mkdir()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}/runtime:{REPO}"}
    worker_args = ["--model", model, "--steps", str(args.steps), "--rows", str(args.rows), "--seq-len", str(args.seq_len), "--out", str(out)]
    with pods(nodes) as names:
        agents = [subprocess.Popen(
            ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$0" "$@"',
             sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
             f"--nproc-per-node={procs}", f"--node-rank={i}", f"--master-addr={SUBNET}.2", f"--master-port={PORT}",
             "-m", "benchmarks.multinode", "worker", *worker_args], cwd=REPO, env=env) for i, name in enumerate(names)]
        codes = [agent.wait(1800) for agent in agents]
    if any(codes):
        raise SystemExit(f"{nodes} pod(s) x {procs} rank(s): torchrun exited {codes}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nodes * procs)]


def summary(results: list[dict]) -> dict[str, float]:
    """Medians over ranks and steps: seconds, and MB each rank sent."""
    def median(key: str, i: int) -> float:
        values = [r[key][i] for r in results] if key in ("save", "load") else \
            [entry[i] for r in results for entry in r[key]]
        return statistics.median(values)

    timings = next(r["timings"] for r in results if r["rank"] == 0)
    return {"step s": median("steps", 0), "sent MB/step/rank": median("steps", 1) / 1e6,
            "forward+backward s": timings["time/forward_backward"],
            "publish wait s": timings["time/publish_weights"], "publish background s": timings["time/publish_background"],
            "publish gather s": median("publish", 0), "publish MB/rank": median("publish", 1) / 1e6,
            "ckpt save s": median("save", 0), "ckpt load s": median("load", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "worker"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--model")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    from rlkube.models.tiny import init_tiny_model

    work = Path(tempfile.mkdtemp(prefix="rlkube-multinode-"))
    try:
        model = str(work / "model")
        init_tiny_model(model)
        rows = {f"{nodes} pod(s) x {procs} rank(s)": summary(run_layout(nodes, procs, args, model, work))
                for nodes, procs in ((1, 2), (2, 1))}
        parameters = json.loads(next(work.glob("out-1x2/rank0.json")).read_text())["parameters"]
        print(f"\ntiny model, {parameters / 1e6:.1f}M parameters (float32); {args.rows} micro-batches of "
              f"one {args.seq_len}-token row a step per rank; medians over ranks and {args.steps - 1} steps")
        columns = list(next(iter(rows.values())))
        print("| layout | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for layout, row in rows.items():
            print(f"| {layout} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
