"""The policy-version clock: which policy inference serves, and how far rollouts may run ahead.

Steps and versions, precisely:

- Policy 0 is the initial model. Trainer step `n` (1, 2, ..., max_steps) trains on batch `n`
  and produces policy `n`; it then reports it (`ReportPolicy(n, location)`), the orchestrator
  pauses every replica, loads it, resumes, and only then advances `policy_step` to `n`.
- With `async_level = k`, rollouts for batch `n` may be generated once `policy_step >= n-1-k`.
  - `k = 0` (synchronous): batch `n` is generated only with policy `n-1`, i.e. after the
    trainer finished step `n-1`; inference and trainer take turns.
  - `k = 1` (one-step overlap, the default): while the trainer computes step `n` (policy
    `n-1` -> `n`), inference already generates batch `n+1` with policy `n-1`.
- A rollout records the versions it ran under (`policy_min` at its start, `policy_max` at its
  end; a weight update in between makes it span two). When batch `n` is assembled, the
  trainer's weights are policy `n-1`; a rollout is dropped when
  `(n - 1) - policy_min > max_off_policy_steps`.
"""

import asyncio


class PolicyClock:
    def __init__(self, async_level: int, policy_step: int = 0):
        self.async_level = async_level
        self.policy_step = policy_step
        self._changed = asyncio.Event()

    def may_generate(self, batch_step: int) -> bool:
        return self.policy_step >= batch_step - 1 - self.async_level

    def newest_batch(self) -> int:
        """The newest batch whose rollouts may be generated right now."""
        return self.policy_step + 1 + self.async_level

    def advance(self, policy_step: int) -> None:
        if policy_step < self.policy_step:
            raise ValueError(f"policy step {policy_step} is older than the loaded {self.policy_step}")
        self.policy_step = policy_step
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()


def off_policy_lag(batch_step: int, policy_min: int) -> int:
    """How many versions the rollout's oldest policy is behind the trainer's at `batch_step`."""
    return (batch_step - 1) - policy_min
