"""An instant fake of vLLM's token-in/token-out routes, for orchestrator tests and benchmarks.

Serves `/inference/v1/generate` (the route verifiers' training client calls), `/v1/models`,
`/health`, and answers every other POST (the RL admin routes: `/pause`, `/resume`,
`/collective_rpc`, ...) with `{}`, recording each as (route, JSON body) in order. A completion is `respond(prompt_ids)` (by default the prompt's last
`completion_len` tokens reversed) plus the stop token, each with logprob -0.25 (or
`logprob(weight version)`: a policy update that changes the sampled tokens' logprobs).

Like vLLM it keeps a pause state and a weight version (`/pause`, `/resume`, `/is_paused`,
`/update_weight_version`, `/weight_info`): a generate request waits while paused, and the
version it ran under is recorded in `generated_versions`, the model it named in
`requested_models`. `restart()` is what a restarted `rlkube inference` looks like: version
"default", paused (`inference.start_paused`), no LoRA adapter. `hang` makes generate requests
wait for ever (an engine about to die), until `shut_down` answers them with vLLM's 500 (an
engine stopping on SIGTERM; `die()` also fails `/health`), `unavailable` answers the next generate requests 503 (a
server still starting behind its Service), and the admin routes in `silent_routes` never
answer.

Like `rlkube inference` with `max_lora_rank`, `/rlkube/load_lora_adapter` (query: location,
step) loads the adapter `rlkube-policy`; a request naming it before that is answered 404.
"""

import asyncio
import threading

from aiohttp import web
from rlkube.config.inference import POLICY_ADAPTER

from tests.fixtures.inference import free_port

ENGINE_DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                         "type": "InternalServerError", "param": None, "code": 500}}
"""vLLM 0.32's answer to the requests it holds when its engine dies (EngineDeadError), as when
a SIGTERM stops it."""


class FakeInference:
    def __init__(self, model: str, stop_token_id: int, completion_len: int = 8, respond=None, max_model_len: int = 4096,
                 logprob=lambda version: -0.25):
        self.model, self.stop_token_id = model, stop_token_id
        self.logprob = logprob
        self.respond = respond or (lambda ids: list(reversed(ids[-completion_len:])))
        self.max_model_len = max_model_len
        self.calls: list[tuple[str, dict]] = []
        self.generate_requests = 0
        self.authorizations: list[str | None] = []
        """The `Authorization` header of each generate request."""
        self.weight_version = "default"
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.generated_versions: list[str] = []
        self.unloadable: set[str] = set()
        """Weight locations whose load the server answers with an error."""
        self.requested_models: list[str] = []
        self.adapter: str | None = None
        """The location of the loaded LoRA adapter."""
        self.hang = False
        self.shut_down = asyncio.Event()
        self.unavailable = 0
        self.dead = False
        self.silent_routes: set[str] = set()
        """Admin routes (e.g. "pause") recorded but never answered."""

    def die(self) -> None:
        """The engine dies with the server still listening: held requests are answered 500
        (`ENGINE_DEAD`), `/health` 503 (call it on the server's loop)."""
        self.dead = True
        self.shut_down.set()

    def restart(self, start_paused: bool = True) -> None:
        """Forget the weights' version and pause, as a freshly started server (call it on the
        server's loop: `FakeInferenceThread.call`)."""
        self.weight_version, self.adapter = "default", None
        if start_paused:
            self.resumed.clear()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", lambda r: web.json_response({}, status=503 if self.dead else 200))
        app.router.add_get("/weight_info", lambda r: web.json_response({"weight_version": self.weight_version}))
        app.router.add_get("/is_paused", lambda r: web.json_response({"is_paused": not self.resumed.is_set()}))
        app.router.add_post("/{route:.*}", self.admin)
        return app

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.generate_requests += 1
        self.authorizations.append(request.headers.get("Authorization"))
        if self.unavailable:
            self.unavailable -= 1
            return web.json_response({"error": "the server is starting"}, status=503)
        if self.hang:
            await self.shut_down.wait()
            return web.json_response(ENGINE_DEAD, status=500)
        await self.resumed.wait()
        if body.get("model") == POLICY_ADAPTER and self.adapter is None:
            return web.json_response({"error": {"message": f"LoRA adapter {POLICY_ADAPTER} does not exist"}}, status=404)
        self.requested_models.append(body.get("model"))
        version = self.weight_version
        self.generated_versions.append(version)
        ids = self.respond(body["token_ids"])[: body["sampling_params"].get("max_tokens", 1 << 30) - 1]
        ids = ids + [self.stop_token_id]
        return web.json_response(
            {
                "request_id": f"fake-{self.generate_requests}",
                "choices": [
                    {
                        "token_ids": ids,
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": self.logprob(version)} for t in ids]},
                        "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
                    }
                ],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.model, "max_model_len": self.max_model_len}]})

    async def admin(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        route = request.match_info["route"]
        self.calls.append((route, body))
        if route in self.silent_routes:
            await asyncio.Event().wait()
        if route == "pause":
            self.resumed.clear()
        elif route == "resume":
            self.resumed.set()
        elif route == "update_weight_version":
            self.weight_version = body["new_version"]
        elif route == "rlkube/load_lora_adapter":
            self.calls[-1] = (route, dict(request.query))
            if request.query["location"] in self.unloadable:
                return web.json_response({"error": f"cannot load {request.query['location']}"}, status=500)
            self.adapter = request.query["location"]
            return web.json_response({"result": f"adapter of step {request.query['step']}"})
        elif route == "collective_rpc":
            if body["kwargs"].get("location") in self.unloadable:
                return web.json_response({"error": f"cannot load {body['kwargs']['location']}"}, status=500)
            return web.json_response({"results": [f"{body['method']} {body['kwargs']}"]})
        return web.json_response({})


class FakeInferenceThread:
    """The fake on its own loop in a thread, at `self.url`, as a separate server process would be."""

    def __init__(self, fake: FakeInference, port: int | None = None):
        self.fake, self.port = fake, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        # A request still waiting at exit is cut off, as when the server process dies.
        runner = web.AppRunner(self.fake.app(), access_log=None, shutdown_timeout=0.1)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def call(self, fn, *args):
        """Run `fn(*args)` on the server's loop (the fake's state belongs to it)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def __enter__(self):
        self.thread.start()
        self.started.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
