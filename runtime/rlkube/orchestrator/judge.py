"""The run's judge as environments reach it: a loopback endpoint in each process that runs rollouts.

Environments scored by verifiers' judges (`rlkube.envs.judge`) call an OpenAI-style endpoint
with the OpenAI SDK, from inside a rollout's scoring. rlkube points them at `JudgeEndpoint`, an
aiohttp server on 127.0.0.1 (a free port) in the orchestrator's process and in each env
worker's, which forwards `/v1/...` to the judge's replicas (`orchestrator.judge.base_urls`,
each request to the one with the fewest in flight, at most `max_concurrent` at once). It
forwards the judge's generation routes alone (`ROUTES`, with their methods): any program an
environment starts can call it, and with the run's credential added, a path that reached the
judge's other routes (`/v1/../collective_rpc`: load weights from an address of the caller's
choosing) would hand it the run's authority. A path is percent-decoded and normalised (`..`,
`.`, `//`) before it is looked up; anything else is answered 404 (405 for another method)
without contacting the judge, and what is forwarded is the route's own path. It exists for
three things the SDK call cannot do:
- the run's generate credential: the judge's vLLM requires it, and environment code never
  sees it (`rlkube.withheld`); the endpoint adds it to what it forwards, to the judge the
  run serves only (`judge.served_by_run`); a judge outside the run gets the key named by
  `judge.api_key_env`, or nothing;
- a judge that is down: a refused, reset or unanswered (`CONNECT_TIMEOUT_S`) connection, or a
  502/503/504, is retried with backoff (0.5 s doubling to 5 s) for up to `judge.wait_s`, so
  the rollout waits; past that the endpoint answers 503 with `JUDGE_UNAVAILABLE` in its
  message, the rollout fails with it, and `run_group` marks it for re-issue
  (`rlkube.orchestrator.rollouts`): it is never scored without its judge;
- metering (`metrics`): `judge/requests` (calls the environments made since the last step),
  `judge/latency_s` (their mean time to an answer, waits included), `judge/errors` (judge
  attempts that failed: refused, reset, timed out, or answered with an error status).
"""

import asyncio
import json
import logging
import posixpath
import time
from typing import Self
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from rlkube import auth
from rlkube.config import JudgeConfig
from rlkube.envs.judge import JudgeTarget
from rlkube.ports import free_port

logger = logging.getLogger(__name__)

JUDGE_UNAVAILABLE = "rlkube: the judge is unavailable"
"""In the message of the 503 the endpoint answers once a judge stayed unreachable `wait_s`."""
RETRIED = frozenset({502, 503, 504})
"""Statuses of a judge that is restarting or behind a proxy with no backend: waited out."""
FIRST_RETRY_S, MAX_RETRY_S = 0.5, 5.0
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET"}
"""What the endpoint forwards: the OpenAI routes verifiers' judges call (chat completions, with
`beta.chat.completions.parse` for structured verdicts), plain completions, and the model list."""
CONNECT_TIMEOUT_S = 5.0
"""How long one attempt dials a judge replica before it counts as unreachable (and is retried
as a refused one is). A judge that is up accepts at once; the address of one whose pod is gone
answers nothing while DNS caches still hold it, and a dial waited out the kernel's ~2 minutes
of SYN retries, past `wait_s`, while the replacement pod already served."""


class JudgeEndpoint:
    """`async with JudgeEndpoint(config) as endpoint:` serves `endpoint.url` until the block ends."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.in_flight = dict.fromkeys(config.base_urls, 0)
        self.headers = {"Content-Type": "application/json",
                        **auth.served_model_headers("judge", config.served_by_run, config.api_key_env)}
        self.slots = asyncio.Semaphore(config.max_concurrent)
        self.requests = self.errors = self.answered = 0
        self.latency_s = 0.0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def target(self) -> JudgeTarget:
        """What environments' judges are pointed at (`rlkube.envs.load_env`)."""
        return JudgeTarget(self.url, self.config.model, dict(self.config.sampling))

    async def wait_until_healthy(self) -> None:
        """Until every judge replica answers `/health` (`timeout_s` at most): a run's first
        rollouts need not wait out a judge that is still starting."""
        from rlkube.inference.client import wait_until_healthy

        await asyncio.gather(*(wait_until_healthy(url, self.config.timeout_s) for url in self.config.base_urls))

    async def __aenter__(self) -> Self:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def handle(self, request: web.Request) -> web.Response:
        route = judge_route(request.raw_path)
        if route not in ROUTES:
            return web.Response(status=404, body=_error(f"rlkube's judge endpoint forwards only {sorted(ROUTES)}",
                                                        "not_found"), content_type="application/json")
        if request.method != ROUTES[route]:
            return web.Response(status=405, body=_error(f"{route} takes {ROUTES[route]} only", "method_not_allowed"),
                                content_type="application/json", headers={"Allow": ROUTES[route]})
        body, started = await request.read(), time.monotonic()
        self.requests += 1
        async with self.slots:
            status, content = await self.forward(request.method, route, body)
        self.latency_s += time.monotonic() - started
        self.answered += 1
        return web.Response(status=status, body=content, content_type="application/json")

    async def forward(self, method: str, route: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of the judge's answer to `method` `route` (one of `ROUTES`), waiting
        out an unreachable judge (see the module docstring)."""
        deadline, delay = time.monotonic() + self.config.wait_s, FIRST_RETRY_S
        while True:
            replica = min(self.in_flight, key=self.in_flight.__getitem__)
            self.in_flight[replica] += 1
            try:
                async with self._session.request(method, f"{replica}{route}", data=body, headers=self.headers) as r:
                    status, content = r.status, await r.read()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                status, content = None, f"{type(e).__name__}: {e}".encode()
            except TimeoutError:
                self.errors += 1
                return 504, _error(f"the judge at {replica} did not answer within {self.config.timeout_s:g} s")
            finally:
                self.in_flight[replica] -= 1
            if status is not None and status not in RETRIED:
                self.errors += status >= 400
                return status, content
            self.errors += 1
            why = content.decode(errors="replace")[-500:] if status is None else f"HTTP {status}"
            if time.monotonic() + delay > deadline:
                return 503, _error(f"{JUDGE_UNAVAILABLE}: {replica}: {why} (waited {self.config.wait_s:g} s)")
            logger.warning("judge %s unreachable (%s): retrying in %.1f s", replica, why, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_S)

    def metrics(self) -> dict[str, float]:
        """`judge/*` since the last call (see the module docstring)."""
        metrics = {"judge/requests": float(self.requests), "judge/errors": float(self.errors)}
        if self.answered:
            metrics["judge/latency_s"] = self.latency_s / self.answered
        self.requests = self.errors = self.answered = 0
        self.latency_s = 0.0
        return metrics


def judge_route(raw_path: str) -> str:
    """The route a request's raw path names: its query dropped, percent-decoded until nothing
    changes (`%252e`), then normalised (`..`, `.`, repeated `/`), so that what is looked up in
    `ROUTES` is the path a server would act on."""
    path = raw_path.split("?", 1)[0]
    while (decoded := unquote(path)) != path:
        path = decoded
    return posixpath.normpath("/" + path.lstrip("/"))


def _error(message: str, kind: str = "judge_unavailable") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


def judge_lost(error: str | None) -> bool:
    """Whether a rollout failed because its judge stayed unreachable (it is then re-issued)."""
    return JUDGE_UNAVAILABLE in (error or "")
