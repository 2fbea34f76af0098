"""An env worker (`rlkube env-worker @ orchestrator.toml`): the orchestrator's rollouts, run in
another process.

It reads the orchestrator's own config, so its environments, tasks, model, sampling and
inference replicas are the orchestrator's: it loads the same environments, routes each task
to the same replica (`InferencePool.context_for`), and runs each group it is sent exactly as
the orchestrator would in-process (`rlkube.orchestrator.rollouts.run_group`), up to
`client.max_concurrent` rollouts at once. It never touches weights or the clock: the
orchestrator drives the replicas and stamps each rollout's policy versions. It dials
`rollouts.host:rollouts.port` (on Kubernetes, the orchestrator's Service) and redials forever.
"""

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from rlkube.config import OrchestratorConfig
from rlkube.orchestrator.app import build_runners
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.judge import JudgeEndpoint
from rlkube.orchestrator.rollouts import EnvRunner, run_group
from rlkube.rollout_types import Rollout
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.env_workers import work

logger = logging.getLogger(__name__)


def tasks_by_id(runner: EnvRunner) -> dict[str, Any]:
    """The env's tasks by the id the orchestrator names them with (`EnvRunner.next_task`)."""
    tasks = {str(task.key): task for task in runner.tasks}
    if len(tasks) != len(runner.tasks):
        raise ValueError(f"environment '{runner.name}': task keys are not unique, so a worker cannot find a task by key")
    return tasks


class GroupRunner:
    """Runs the groups the orchestrator sends, as the orchestrator would run them in-process."""

    def __init__(self, config: OrchestratorConfig, runners: list[EnvRunner], pool):
        self.config, self.pool = config, pool
        self.runners = {r.name: r for r in runners}
        self.tasks = {r.name: tasks_by_id(r) for r in runners}

    async def __call__(self, group: pb.GroupTask) -> list[Rollout]:
        """A group that cannot run at all comes back errored (the orchestrator counts it, and
        stops on a batch of nothing but errors), like a rollout that fails in-process."""
        try:
            runner, task = self.runners[group.env], self.tasks[group.env][group.example_id]
        except KeyError:
            error = f"KeyError: env worker has no task {group.env}/{group.example_id}"
            return [Rollout(group.env, group.example_id, 0.0, [], 0, 0, error=error) for _ in range(group.group_size)]
        return await run_group(
            runner, self.pool, group.example_id, task, group.group_size, self.config.sampling.temperature,
            lambda: 0,  # the orchestrator stamps the versions from its clock (rlkube.orchestrator.workers)
            group.model or None,
        )


def hello(config: OrchestratorConfig, runners: list[EnvRunner]) -> pb.WorkerHello:
    return pb.WorkerHello(
        worker_id=f"{socket.gethostname()}:{os.getpid()}",
        max_groups=config.max_groups_in_flight,
        envs=[r.name for r in runners],
    )


async def serve(config: OrchestratorConfig) -> None:
    judge = JudgeEndpoint(config.judge) if config.judge else None
    runners = build_runners(config, judge)
    pool = InferencePool(config.client, config.model.name, config.model.name, config.sampling,
                         member=config.pool.member if config.pool else None)
    address = f"{config.rollouts.host}:{config.rollouts.port}"
    async with contextlib.AsyncExitStack() as stack:
        if judge is not None:
            await stack.enter_async_context(judge)
        for runner in runners:
            await stack.enter_async_context(runner.serving())
        watcher = asyncio.ensure_future(pool.watch_reachable())  # replicas that go silent
        try:
            await work(address, hello(config, runners), GroupRunner(config, runners, pool))
        finally:
            watcher.cancel()
