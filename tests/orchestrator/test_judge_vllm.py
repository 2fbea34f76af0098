"""`rlkube orchestrator`'s whole process with a served judge: the shared real vLLM server is both
the policy and the judge, the judge's answer fixed by vLLM's structured outputs (a choice of one
label), and a fake trainer fetches the batch over gRPC. The batch's rewards (its samples file,
what the trainer trained on) must be the fixed verdict, also when the judge's port refuses
connections until after the rollouts were scored once."""

import asyncio
import contextlib
import json
import threading
import time

import pytest
from rlkube.config import OrchestratorConfig
from rlkube.metrics import read_metrics
from rlkube.ports import free_port
from rlkube.transport.client import RolloutClient

from tests.orchestrator.test_orchestrator_vllm import serve_beside_trainer

pytestmark = pytest.mark.slow


class JudgeOutage:
    """The judge's port, forwarding to `target` (host, port), except that the first judge call
    starts an outage: for `down_s` every connection that posts is dropped before it reaches the
    judge (a judge pod killed mid-run; its health check at the run's start passed)."""

    def __init__(self, target: tuple[str, int], down_s: float):
        self.target, self.down_s, self.port = target, down_s, free_port()
        self.outage_started: float | None = None
        self.dropped = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, reader, writer):
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def _down(self) -> bool:
        now = time.monotonic()
        self.outage_started = self.outage_started or now
        return now - self.outage_started < self.down_s

    async def _forward(self, reader, writer):
        first = await reader.read(65536)
        if first.startswith(b"POST") and self._down():
            self.dropped += 1
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        upstream_writer.write(first)
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    def __enter__(self):
        self.thread.start()
        start = asyncio.start_server(self._forward, "127.0.0.1", self.port)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def run_judged(inference_server, tmp_path, verdict: str, judge_url: str, wait_s: float) -> tuple[list[dict], dict]:
    grpc_port = free_port()
    config = OrchestratorConfig.model_validate({
        "output_dir": tmp_path, "max_steps": 1, "batch_size": 8, "group_size": 4, "seq_len": 128,
        "model": {"name": str(inference_server.model)}, "sampling": {"max_tokens": 8},
        "filter_zero_advantage": False, "samples_interval": 1,
        "envs": [{"id": "judged_reverse_text", "args": {"num_examples": 20}}],
        "client": {"base_urls": [inference_server.base_url]},
        "judge": {"model": inference_server.model_name, "base_urls": [judge_url], "wait_s": wait_s, "served_by_run": True,
                  "sampling": {"temperature": 0.0, "max_tokens": 4, "structured_outputs": {"choice": [verdict]}}},
        "rollouts": {"port": grpc_port}, "http_port": free_port(),
    })

    def trainer():
        with RolloutClient(f"127.0.0.1:{grpc_port}", timeout_s=300) as client:
            client.get_batch(1, 0, 1, 2)
            client.report_policy(1, inference_server.original_weights)

    serve_beside_trainer(config, trainer, timeout=300)
    rows = [json.loads(line) for line in (tmp_path / "samples" / "step_1.jsonl").read_text().splitlines()]
    (metrics,) = [r for r in read_metrics(tmp_path, "orchestrator") if "judge/requests" in r]
    return rows, metrics


def replied(row: dict) -> bool:
    """Whether the rollout's reply has text (verifiers' reference judge scores an empty one 0.0
    without calling the judge): what comes before its first `<tool_call>` (Qwen3's chat format
    reads what follows as a tool call, not reply text; the tiny untrained model samples that
    token) and its end tokens. Seen on the cluster scenario: replies that start with
    `<tool_call>`, or are `<|endoftext|>` alone, scored 0.0 with no judge call."""
    reply = row["completion"].split("<tool_call>", 1)[0]
    return bool(reply.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip())


def judge_calls(rows: list[dict]) -> int:
    """The judge calls that scored a batch, from its rollouts' own records (`sample_rows`, the
    batch's samples file): one per rollout with a reply that did not error. Per batch, unlike
    `judge/requests`, which counts the calls made between two logged steps, whichever batch
    their rollouts went into."""
    return sum(1 for row in rows if replied(row) and not row["error"])


def assert_rewards_are(rows: list[dict], metrics: dict, reward: float) -> None:
    assert len(rows) == 8 and all(row["error"] == "" for row in rows), rows
    assert [row["reward"] for row in rows] == [reward if replied(row) else 0.0 for row in rows], rows
    assert metrics["errored_rollouts"] == 0
    assert metrics["judge/requests"] >= sum(map(replied, rows)) > 0


def test_the_batch_rewards_are_the_served_judges_verdict(inference_server, tmp_path):
    rows, metrics = run_judged(inference_server, tmp_path, "no", inference_server.base_url, wait_s=60)
    assert_rewards_are(rows, metrics, 0.0)
    assert metrics["judge/requests"] == sum(map(replied, rows)), "one call per rollout with a reply"
    assert metrics["judge/errors"] == 0 and metrics["judge/latency_s"] > 0


def test_a_judge_down_mid_run_is_waited_for_and_its_rollouts_rescored(inference_server, tmp_path):
    """The judge drops every call for 4 s from the first one while each call waits 1 s for it:
    the calls fail, their rollouts run again until the judge answers; none is scored without it."""
    target = ("127.0.0.1", int(inference_server.base_url.rsplit(":", 1)[1]))
    with JudgeOutage(target, down_s=4.0) as outage:
        rows, metrics = run_judged(inference_server, tmp_path, "yes", f"http://127.0.0.1:{outage.port}", wait_s=1.0)
    assert outage.dropped > 0
    assert_rewards_are(rows, metrics, 1.0)
    assert metrics["judge/errors"] > 0 and metrics["rollouts/reissued"] > 0
