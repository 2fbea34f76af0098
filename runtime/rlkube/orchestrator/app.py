"""Build the orchestrator from its config and run it with its servers (what
`rlkube orchestrator` runs): environments, inference pool, metrics, gRPC and HTTP servers,
resume, and an orderly shutdown. A pool member (`orchestrator.pool`) attaches itself to the
pool trainer once its servers are up, and when the pool trainer loses it (`PoolLost`: it
restarted) starts over from its own newest checkpoint, attaching again.
"""

import asyncio
import contextlib
import logging

from rlkube.checkpoints import checkpoint_root, unmark_after
from rlkube.config import OrchestratorConfig
from rlkube.config.cli import write_finished_step
from rlkube.orchestrator import checkpoint
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.judge import JudgeEndpoint
from rlkube.orchestrator.membership import Membership, PoolLost
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.orchestrator.rollouts import EnvRunner
from rlkube.orchestrator.status import PrometheusMetrics, make_app, start_http
from rlkube.transport.server import start_server, stop_server

logger = logging.getLogger(__name__)

FINISHED_LINGER_S = 3.0


def build_runners(config: OrchestratorConfig, judge: JudgeEndpoint | None = None) -> list[EnvRunner]:
    """The training environments' runners, their judges pointed at `judge` when given."""
    from rlkube.envs import load_env

    target = judge.target if judge else None
    runners = [EnvRunner(env, load_env(env, target), config.seed, config.difficulty) for env in config.envs]
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise ValueError(f"orchestrator.envs: names must be unique (got {names}); set `name` on repeated ids")
    return runners


def resume_step_of(config: OrchestratorConfig, latest: bool = False) -> int | None:
    """The step to resume from (`latest` with no complete checkpoint: None, a fresh start);
    `latest`: the newest whatever `ckpt.resume_step` says (a member starting over). A
    fresh start abandons every step left by earlier attempts: their orchestrator parts are
    unmarked, so none pairs with a trainer part this run writes (`run` does it for a resume)."""
    if config.ckpt is None:
        return None
    root = checkpoint_root(config.output_dir, config.ckpt)
    step = checkpoint.resolve_step(root, "latest" if latest else config.ckpt.resume_step, alone=config.pool is not None)
    if step is None:
        unmark_after(root, 0, checkpoint.PROCESS)
    return step


async def serve(config: OrchestratorConfig) -> None:
    if config.pool is None:
        await serve_once(config)
        return
    membership, again = Membership(config), False
    while True:
        try:
            await serve_once(config, membership, again)
            return
        except PoolLost as e:
            logger.warning("%s: starting over from this member's newest checkpoint, attaching again", e)
            again = True


async def serve_once(config: OrchestratorConfig, membership: Membership | None = None, again: bool = False) -> None:
    """One life of the orchestrator; `again`: a member starting over from its newest checkpoint."""
    from rlkube.metrics import MetricsSink
    from rlkube.orchestrator.eval import periodic_eval
    from rlkube.orchestrator.samples import sample_logger

    resume_step = resume_step_of(config, latest=again)
    judge = JudgeEndpoint(config.judge) if config.judge else None
    runners = build_runners(config, judge)
    pool = InferencePool(
        config.client, config.model.name, config.model.name, config.sampling,
        trainer_sends_weights=config.weights.type == "nccl", member=config.pool.member if config.pool else None,
    )
    prometheus = PrometheusMetrics()
    sink = MetricsSink(config.output_dir, "orchestrator", wandb=config.wandb, run_config=config.model_dump(mode="json"))

    def log_metrics(metrics: dict[str, float], step: int) -> None:
        sink.log(step, metrics)
        prometheus.update(metrics)

    evaluate = periodic_eval(config, pool, judge) if config.eval is not None else None
    log_samples = (sample_logger(config.model, config.samples_interval, sink.log_rows)
                   if config.samples_interval is not None else None)
    orchestrator = Orchestrator(config, runners, pool, log_metrics, evaluate, log_samples, judge)
    host = config.rollouts.host
    logger.info("orchestrator instance %s", orchestrator.instance_id)
    grpc_server = await start_server(orchestrator, host, config.rollouts.port, workers=orchestrator.workers)
    http, _ = await start_http(make_app(orchestrator.status, prometheus), host, config.http_port)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if judge is not None:  # eval's rollouts call it, also with env workers
                await stack.enter_async_context(judge)
            if orchestrator.workers is None:  # else the env workers serve the rollouts
                for runner in runners:
                    await stack.enter_async_context(runner.serving())
            await pool.wait_until_healthy(config.client.timeout_s)
            if orchestrator.teacher is not None:
                await orchestrator.teacher.wait_until_healthy()
            if judge is not None:
                await judge.wait_until_healthy()
            if membership is None:
                await orchestrator.run(resume_step)
            else:
                policy0 = await membership.attach(resume_step)
                if resume_step is None:  # its step-0 adapter, which every request names until policy 1
                    orchestrator.policy_location = policy0
                await membership.while_member(orchestrator.run(resume_step))
        logger.info("finished: policy %d loaded, %d steps done", orchestrator.clock.policy_step, config.max_steps)
        if orchestrator.phase == "finished":  # the operator ends a pool member's run on it (no trainer of its own)
            write_finished_step(orchestrator.trained_step)
        # Stay reachable briefly so the trainer (waiting for its last policy to be loaded) and
        # the operator read the final status instead of a refused connection.
        await asyncio.sleep(FINISHED_LINGER_S)
    finally:
        if membership is not None and orchestrator.phase != "finished":
            await membership.detach()
        await stop_server(grpc_server)
        await http.cleanup()
        sink.close()
