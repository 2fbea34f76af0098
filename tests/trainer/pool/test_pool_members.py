"""Two REAL member orchestrators (`orchestrator.pool`, each its own `rlkube orchestrator`
process with its own member credentials) on one REAL pool: `rlkube pool-trainer` in its own
process and `rlkube inference` serving LoRA with two adapter slots (vLLM), all three holding
or checking the pool's token. Each member's requests pass through a recording proxy of its
own, so the test sees what each one asked the shared engine.

Each member attaches itself, names its adapter in every request (its step-0 adapter, base eval
included), loads each new adapter by name without pausing the engine, counts its off-policy lag
from its own adapter's steps (a bound of 2 that the server's untagged version would break from
step 3 on), and, when the pool trainer is killed and started again (its roster is lost),
notices, starts over from its own checkpoint and attaches again; both train to max_steps."""

import json
import os
import re
import sys
import threading

import aiohttp
import pytest
from aiohttp import web
from rlkube import auth
from rlkube.auth import TOKEN_ENV
from rlkube.checkpoints import is_complete
from rlkube.config import TrainerConfig, write_toml
from rlkube.config.pool import PoolTrainerConfig
from rlkube.inference.client import ADAPTER_ROUTE
from rlkube.inference.member_auth import MODEL_ROUTES
from rlkube.ports import free_port
from rlkube.scopes import member_env

from tests.fixtures.polling import wait_until
from tests.fixtures.processes import spawn, stop
from tests.inference.test_lora_weights import LORA, serve_lora
from tests.orchestrator.fake_inference import FakeInferenceThread
from tests.orchestrator.test_env_workers import reverse_text_config

pytestmark = pytest.mark.slow

MAX_STEPS = {"team-a.lr-fast": 6, "team-b.lr-slow": 6}
CKPT = {"interval": 2}
RESTART_AFTER_STEP = 2
"""The pool trainer is killed once every member has a complete checkpoint of this step."""


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    """The pool's inference: two adapter slots, the pool's token (this session's) in its environment."""
    yield from serve_lora(tiny_model, tmp_path_factory.mktemp("pool_engine"), max_loras=len(MAX_STEPS))


class RecordingProxy:
    """Forwards every request to `target`, recording (method, path, model named, query) in order."""

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.requests: list[tuple[str, str, str | None, dict]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{path:.*}", self.forward)
        return app

    async def forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        model = json.loads(body).get("model") if request.path in MODEL_ROUTES and body else None
        self.requests.append((request.method, request.path, model, dict(request.query)))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session, \
                session.request(request.method, self.target + request.path_qs, data=body, headers=headers) as answer:
            data = await answer.read()
            return web.Response(status=answer.status, body=data,
                                headers={"Content-Type": answer.headers.get("Content-Type", "application/json")})


class PauseWatch:
    """Asks the engine (with the pool's own admin credential) every 0.1 s whether it is paused."""

    def __init__(self, url: str):
        self.url, self.paused, self.polls = url, 0, 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import httpx

        with httpx.Client(timeout=10, headers=auth.route_headers("/is_paused")) as http:
            while not self.stopping.wait(0.1):
                self.paused += bool(http.get(f"{self.url}/is_paused").json()["is_paused"])
                self.polls += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(10)


def start_pool_trainer(config_path, log):
    argv = [sys.executable, "-m", "rlkube.entrypoints.pool_trainer", "@", str(config_path)]
    return spawn(argv, log=log, ready=lambda: "pool Attach/Detach service on" in log.read_text(), timeout=300,
                 what="rlkube pool-trainer")


def member_process(name: str, tmp_path, tiny_model, proxy_url: str, pool_address: str):
    """`rlkube orchestrator` of member `name`, with that member's credentials alone."""
    trainer_toml = tmp_path / name / "trainer.toml"
    trainer_toml.parent.mkdir(parents=True)
    write_toml(TrainerConfig(model={"name": str(tiny_model)}, device="cpu", seed=len(name), max_steps=MAX_STEPS[name],
                             optim={"lr": 1e-3}, lora=LORA, ckpt=CKPT), trainer_toml)
    config = reverse_text_config(
        tmp_path / name, tiny_model, proxy_url, env_workers=0, max_steps=MAX_STEPS[name], max_off_policy_steps=2,
        ckpt=CKPT, eval={"interval": 3, "num_examples": 2}, http_port=free_port(),
        client={"base_urls": [proxy_url], "max_concurrent": 16, "resync_interval_s": 0.5},
        pool={"member": name, "trainer": pool_address, "trainer_config": str(trainer_toml), "check_interval_s": 0.5})
    orchestrator_toml = tmp_path / name / "orchestrator.toml"
    write_toml(config, orchestrator_toml)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | member_env(os.environ[TOKEN_ENV], name, "orchestrator")
    argv = [sys.executable, "-m", "rlkube.entrypoints.orchestrator", "@", str(orchestrator_toml)]
    return spawn(argv, log=tmp_path / name / "orchestrator.log", env=env)


def checkpointed(pool_dir, tmp_path, name: str, step: int) -> bool:
    """Both halves of member `name` have a complete checkpoint of `step`."""
    return (is_complete(pool_dir / "members" / name / "checkpoints", step, "trainer")
            and is_complete(tmp_path / name / "checkpoints", step, "orchestrator"))


def test_two_member_orchestrators_train_on_a_real_pool_and_rejoin_it_after_it_restarts(engine, tiny_model, tmp_path):
    port = free_port()
    pool = PoolTrainerConfig(output_dir=tmp_path / "pool", model={"name": str(tiny_model)},
                             trainer={"device": "cpu", "lora": LORA}, pool={"port": port, "probe_interval_s": 0.2})
    write_toml(pool, pool_toml := tmp_path / "pool.toml")
    logs = [tmp_path / "pool-trainer-1.log", tmp_path / "pool-trainer-2.log"]
    proxies = {name: RecordingProxy(engine) for name in MAX_STEPS}
    trainer = start_pool_trainer(pool_toml, logs[0])
    members: dict = {}
    try:
        with PauseWatch(engine) as pauses, FakeInferenceThread(proxies["team-a.lr-fast"]) as proxy_a, \
                FakeInferenceThread(proxies["team-b.lr-slow"]) as proxy_b:
            urls = {"team-a.lr-fast": proxy_a.url, "team-b.lr-slow": proxy_b.url}
            members = {name: member_process(name, tmp_path, tiny_model, urls[name], f"127.0.0.1:{port}")
                       for name in MAX_STEPS}

            def explain() -> str:
                return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in
                                 [*[tmp_path / n / "orchestrator.log" for n in MAX_STEPS], *logs] if p.exists())

            def checkpoints_of_both() -> bool:
                assert not [n for n, p in members.items() if p.poll() is not None], f"a member exited:\n{explain()}"
                return all(checkpointed(pool.output_dir, tmp_path, n, RESTART_AFTER_STEP) for n in MAX_STEPS)

            wait_until(checkpoints_of_both, 600, f"both members' checkpoints of step {RESTART_AFTER_STEP}", 0.2,
                       explain)
            stop(trainer, grace_s=0)  # SIGKILL: its roster (in memory) is gone
            trainer = start_pool_trainer(pool_toml, logs[1])
            wait_until(lambda: all(p.poll() is not None for p in members.values()), 300, "both members to finish",
                       1.0, explain)
    finally:
        for process in members.values():
            stop(process, grace_s=5)
        stop(trainer, grace_s=10)
    for name, process in members.items():
        log = (tmp_path / name / "orchestrator.log").read_text()
        assert process.returncode == 0, log[-4000:]
        assert f"finished: policy {MAX_STEPS[name]} loaded" in log
        assert "starting over from this member's newest checkpoint" in log, "it noticed the pool trainer's restart"
        resumed = re.search(rf"run {re.escape(name)} joined the pool at step (\d+)", logs[1].read_text())
        assert resumed and int(resumed.group(1)) >= RESTART_AFTER_STEP, "the second pool trainer resumed it"
        requests = proxies[name].requests
        generated = [model for _, path, model, _ in requests if path in MODEL_ROUTES]
        assert generated and set(generated) == {name}, f"{name}'s requests named {set(generated)}"
        loads = [query for method, path, _, query in requests if (method, path) == ("POST", ADAPTER_ROUTE)]
        assert {query["name"] for query in loads} == {name}
        assert {int(query["step"]) for query in loads} >= {0, MAX_STEPS[name]}
        assert all(f"/members/{name}/weights/step_" in query["location"] for query in loads)
        assert not [path for _, path, _, _ in requests if path in ("/pause", "/resume")], "a member paused the engine"
    assert pauses.polls > 50 and pauses.paused == 0, "the engine was paused while members generated"
