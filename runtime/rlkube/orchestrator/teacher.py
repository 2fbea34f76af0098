"""The teacher of on-policy distillation: its log-prob of exactly the tokens the student sampled.

Once a group's rollouts are final (back from this process or an env worker, before advantages
and packing), every sample's full token ids (prompt and completion) go to the teacher's vLLM
server as a token-id prompt with `prompt_logprobs=0` and `max_tokens=1`: vLLM answers with the
log-prob of each prompt token given the ones before it, from one prefill, with no re-tokenization.
The trainer's loss pulls the student toward them on its sampled tokens
(`rlkube.trainer.rl.loss.teacher_kl_term`).

vLLM computes prompt log-probs from the raw logits (its sampling processors, the temperature
among them, do not apply to prompt tokens): they are the teacher at temperature 1, so sampling
the student at temperature 1 makes the trained term the exact reverse KL.

A group goes to one teacher replica (the same stable hash as the student's routing), so its
samples share the prompt's prefix cache there; `max_concurrent` bounds the requests in flight.
A sample the teacher fails to score fails its rollout, which is then counted but not trained.
"""

import asyncio
import logging

from rlkube import auth
from rlkube.config import TeacherConfig
from rlkube.inference.client import InferenceError, post, wait_until_healthy
from rlkube.orchestrator.inference import pick_replica
from rlkube.orchestrator.scheduler import RunGroup
from rlkube.rollout_types import Rollout, Sample

logger = logging.getLogger(__name__)


class Teacher:
    def __init__(self, config: TeacherConfig):
        self.config = config
        self.slots = asyncio.Semaphore(config.max_concurrent)
        self.headers = auth.served_model_headers("teacher", config.served_by_run, config.api_key_env)

    async def wait_until_healthy(self) -> None:
        await asyncio.gather(*(wait_until_healthy(url, self.config.timeout_s) for url in self.config.base_urls))

    async def token_logprobs(self, base_url: str, token_ids: list[int]) -> list[float]:
        """The teacher's log-prob of each token given the tokens before it (0.0 for the first)."""
        request = {"model": self.config.model, "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0}
        async with self.slots:
            response = await post(base_url, "/v1/completions", self.config.timeout_s, self.headers, json=request)
        prompt_logprobs = response.json()["choices"][0]["prompt_logprobs"]
        if len(prompt_logprobs) != len(token_ids):
            raise InferenceError(f"{base_url}: {len(prompt_logprobs)} prompt log-probs for {len(token_ids)} tokens")
        return [0.0] + [entry[str(token)]["logprob"] for token, entry in zip(token_ids[1:], prompt_logprobs[1:])]

    async def score_sample(self, base_url: str, sample: Sample) -> None:
        """Set `sample.teacher_logprobs` on its loss tokens (0.0 elsewhere)."""
        logprobs = await self.token_logprobs(base_url, sample.token_ids)
        sample.teacher_logprobs = [lp if trained else 0.0 for lp, trained in zip(logprobs, sample.loss_mask)]

    async def score_rollout(self, rollout: Rollout) -> None:
        base_url = pick_replica(rollout.env, rollout.example_id, self.config.base_urls)
        try:
            await asyncio.gather(*(self.score_sample(base_url, sample) for sample in rollout.samples))
        except InferenceError as e:
            logger.warning("teacher could not score a rollout of %s/%s: %s", rollout.env, rollout.example_id, e)
            rollout.error = f"TeacherError: {e}"

    async def score_group(self, group: list[Rollout]) -> list[Rollout]:
        """Teacher log-probs on every sample of the group's trainable rollouts."""
        await asyncio.gather(*(self.score_rollout(r) for r in group if r.trainable))
        return group


def scored_by(teacher: Teacher, run_group: RunGroup) -> RunGroup:
    """`run_group`, whose rollouts the teacher scores once they are final."""

    async def run_and_score(runner, example_id: str, task, size: int) -> list[Rollout]:
        return await teacher.score_group(await run_group(runner, example_id, task, size))

    return run_and_score
