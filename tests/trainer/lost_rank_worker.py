"""One rank of the lost-rank test: the trainer's process-group setup, then all-reduces in a loop
until its peer is gone (the test freezes the other node). With `finish`, ten all-reduces, then
rank 1 closes and exits while rank 0 works on alone for twice the peer timeout."""

import sys
import time

from rlkube.trainer.dist import all_reduce_sum, close_distributed, init_distributed

peer_timeout_s, finish = float(sys.argv[1]), sys.argv[2:] == ["finish"]
info = init_distributed("cpu", cpu_threads=1, peer_timeout_s=peer_timeout_s)
step = 0
while not (finish and step == 10):
    total = all_reduce_sum(1.0, info.device)
    assert total == info.world_size
    step += 1
    print(f"rank {info.rank} step {step}", flush=True)
    time.sleep(0.05)
if info.rank == 0:
    time.sleep(2 * peer_timeout_s)  # a rank 0 still saving or publishing after its peer is done
close_distributed()
print(f"rank {info.rank} done", flush=True)
