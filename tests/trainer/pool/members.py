"""Member orchestrators for pool tests: real Rollouts gRPC servers over synthetic batches whose
shape, readiness and faults a test sets, and a pool trainer on the tiny model around them."""

import asyncio
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from rlkube.config import TrainerConfig
from rlkube.config.pool import PoolTrainerConfig
from rlkube.trainer.pool.loop import PoolLoop
from rlkube.trainer.pool.roster import Roster
from rlkube.trainer.rl.multi_run import MultiRunTrainer
from rlkube.transport.pool import start_pool_server

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_trainer import Server, SyntheticSource, synthetic_batch

LORA = {"rank": 8, "alpha": 16.0}


class MemberSource(SyntheticSource):
    """`rows` one-row micro-batches a step (24 tokens each); its batches are ready up to
    `ready_step`; `poison` maps a step to what is wrong with its batch ("nan", "empty")."""

    def __init__(self, seed: int, rows: int, ready_step: int = 10**6, poison: dict | None = None):
        super().__init__(None)
        self.seed, self.rows, self.ready_step, self.poison = seed, rows, ready_step, poison or {}
        self.served: list[int] = []

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        while step > self.ready_step:  # as an orchestrator's: the batch when it is there
            await asyncio.sleep(0.05)
        generator = torch.Generator().manual_seed(1000 * self.seed + step)
        batches = [synthetic_batch(generator) for _ in range(self.rows)]
        total = sum(int(b["loss_mask"].sum()) for b in batches)
        for batch in batches:
            batch["inference_logprobs"] = -5.0 + 0.5 * torch.randn(batch["input_ids"].shape, generator=generator)
            batch["global_loss_tokens"] = 0 if self.poison.get(step) == "empty" else total
            if self.poison.get(step) == "nan":
                batch["advantages"] = torch.full_like(batch["advantages"], float("nan"))
        self.served.append(step)
        return batches

    def status(self):
        return super().status() | {"batch_ready_step": self.ready_step}


def member_config(tiny_model, seed: int, max_steps: int = 1000, **fields) -> str:
    """A member's trainer config as its orchestrator sends it with Attach."""
    config = TrainerConfig(output_dir="unused", model={"name": str(tiny_model)}, device="cpu", seed=seed,
                           max_steps=max_steps, optim={"lr": 1e-3}, lora=LORA, **fields)
    return config.model_dump_json()


def pool_config(tiny_model, tmp_path, **pool) -> PoolTrainerConfig:
    return PoolTrainerConfig(output_dir=tmp_path / "pool", model={"name": str(tiny_model)},
                             trainer={"device": "cpu", "lora": LORA},
                             pool={"port": 0, "probe_interval_s": 0.1, **pool})


@contextmanager
def member_server(source):
    with Server(source, free_port()) as server:
        yield f"127.0.0.1:{server.port}", server


@contextmanager
def recording_inference():
    """A stand-in for the pool's inference: yields (its URL, the list of (path?query,
    Authorization) of every POST it got), answering each as rlkube's unload route does."""
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append((self.path, self.headers.get("Authorization")))
            body = b'{"result": "unloaded"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", calls
    finally:
        server.shutdown()
        server.server_close()


class RunningPool:
    """A pool trainer (world of one) with its Attach service; `start()` runs its loop in a thread."""

    def __init__(self, config: PoolTrainerConfig, pool_token: str | None = None):
        """Without `pool_token` its Attach service is open, and it pulls from the members'
        servers with this process's rollouts credential (the test session's run token)."""
        self.config = config
        self.pool = MultiRunTrainer.build(config.base_trainer_config())
        self.roster = Roster(config, self.pool.misfit, lambda member: None)
        self.server = start_pool_server(self.roster, "127.0.0.1", 0, pool_token)
        self.address = f"127.0.0.1:{self.server.port}"
        self.loop = PoolLoop(self.pool, self.roster, lambda member: None, config.pool.fetch_unavailable_s,
                             config.output_dir / "pool_status.json")
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.loop.run()
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.error = e

    def start(self) -> "RunningPool":
        self.thread.start()
        return self

    def wait_for(self, condition, timeout_s: float = 300.0, what: str = "") -> dict:
        """Poll the roster's status until `condition(status)`; fail on the loop's error or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.error is None, f"the pool loop failed: {self.error!r}"
            status = self.roster.status()
            if condition(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.roster.status()}")

    def close(self):
        """Stop the loop and free the pool (before the members' servers stop: its members'
        last reports go to them); a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self.roster.stop()
        if self.thread.is_alive():
            self.thread.join(120)
        self.server.stop(grace=1)
        self.loop.close()
        self.roster.close()
        self.pool.close()
