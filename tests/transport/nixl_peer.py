"""One side of tests/transport/test_weights_nixl.py's two-pod test, run inside a network
namespace:

    nixl_peer.py publish HOST PORT      publishes steps 1 and 2, says so, serves until stdin closes
    nixl_peer.py receive HOST:PORT DIR  reads steps 1 and 2, saves them under DIR with the bytes
                                        its eth0 received meanwhile
"""

import json
import sys
from pathlib import Path

import torch


def state(seed: int, rows: int = 64) -> dict[str, torch.Tensor]:
    """Every dtype a snapshot carries, odd sizes (unaligned offsets), a scalar and an empty one."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(rows, 24, generator=g),
        "norm.weight": torch.randn(7, generator=g).bfloat16(),
        "half": torch.randn(3, 5, generator=g).half(),
        "positions": torch.arange(seed, seed + 11),
        "scale": torch.tensor(float(seed)),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
    }


def received_bytes() -> int:
    return int(Path("/sys/class/net/eth0/statistics/rx_bytes").read_text())


def main() -> None:
    from rlkube.transport.weights_nixl import NixlPublisher, NixlReceiver

    role, where = sys.argv[1], sys.argv[2]
    if role == "publish":
        publisher = NixlPublisher(where, int(sys.argv[3]), keep_last=2, transports=["tcp"], bind_host="0.0.0.0")
        for step in (1, 2):
            publisher.publish(state(step, rows=4096), step)
        print("published 1 2", flush=True)
        sys.stdin.read()
        publisher.close()
        return
    out = Path(sys.argv[3])
    out.mkdir(parents=True)
    receiver, before = NixlReceiver(), received_bytes()
    for step in (1, 2):
        _, tensors = receiver.receive(where, step, timeout=60)
        torch.save({name: tensor.clone() for name, tensor in tensors.items()}, out / f"step_{step}.pt")
    (out / "eth0.json").write_text(json.dumps({"rx_bytes": received_bytes() - before}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))
    main()
