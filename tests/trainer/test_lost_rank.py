"""A rank whose peer node is gone exits within seconds, not at the collective's timeout.

Two torchrun nodes on loopback, launched as the operator renders a two-pod trainer
(`--nnodes=2 --node-rank=i --master-addr --master-port`, one rank each, gloo), all-reduce in a
loop through the trainer's `init_distributed`. One node's agent and rank are then frozen with
SIGSTOP: a node that is lost or cut off, whose sockets close no connection, so gloo on the other
waits in the all-reduce. (A SIGKILL closes the sockets and gloo notices in seconds even without
the watchdog.) The surviving node's torchrun must exit non-zero within the bound, its rank with
`EXIT_PEER_LOST`: when node 1 froze, from node 1's stale heartbeat; when node 0 froze, from
torchrun's store (in node 0's agent) no longer answering. Without the watchdog node 0 was still
blocked 120 s after node 1 froze.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from rlkube.ports import free_port
from rlkube.trainer.dist import EXIT_PEER_LOST

pytestmark = pytest.mark.slow  # two torchrun gangs each, and the peer timeouts waited out

WORKER = Path(__file__).with_name("lost_rank_worker.py")
PEER_TIMEOUT_S = 3.0
BOUND_S = 30.0
"""Well above the watchdog's 3 s plus a loaded machine's slack; far below gloo's 30 minutes."""


def start_node(node_rank: int, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
           f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
           str(WORKER), str(PEER_TIMEOUT_S)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def process_tree(pid: int) -> list[psutil.Process]:
    """The agent and its ranks: torchrun starts each rank in a session of its own."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@pytest.mark.parametrize("frozen_rank", [1, 0], ids=["peer-frozen", "store-host-frozen"])
def test_a_rank_exits_within_seconds_when_its_peer_node_is_frozen(frozen_rank: int):
    port = free_port()
    nodes = [start_node(0, port), start_node(1, port)]
    survivor, lost = nodes[1 - frozen_rank], nodes[frozen_rank]
    lines: list[str] = []
    stepped = threading.Event()

    def read() -> None:
        for line in survivor.stdout:
            lines.append(line)
            if "step 10" in line:
                stepped.set()

    threading.Thread(target=read, daemon=True).start()
    stopped: list[psutil.Process] = []
    try:
        assert stepped.wait(120), "the two nodes never all-reduced:\n" + "".join(lines)
        stopped = process_tree(lost.pid)
        for process in stopped:
            process.send_signal(signal.SIGSTOP)
        lost_at = time.monotonic()
        try:
            code = survivor.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {1 - frozen_rank} still blocked {BOUND_S:.0f} s after node {frozen_rank} froze") from None
        elapsed = time.monotonic() - lost_at
        print(f"node {1 - frozen_rank} exited {code} {elapsed:.1f} s after node {frozen_rank} froze")
        assert code != 0
        assert f"exitcode  : {EXIT_PEER_LOST}" in "".join(lines), "".join(lines)
    finally:
        for node in nodes:
            if node.poll() is None:
                for process in process_tree(node.pid):
                    process.kill()
        for process in stopped:
            if process.is_running():
                process.kill()
        for node in nodes:
            node.wait(10)


def test_a_peer_that_finished_is_not_a_lost_peer():
    """A rank that closed its process group leaves the watch: rank 0, still at work for twice the
    peer timeout after rank 1 exited, ends with 0 instead of `EXIT_PEER_LOST`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(WORKER), str(PEER_TIMEOUT_S), "finish"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0 done" in out.stdout and "rank 1 done" in out.stdout
