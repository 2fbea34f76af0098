"""Rank 0's membership: who attached, who is ready, who is evicted, and so what every rank
does next (a `Plan`, broadcast by rlkube.trainer.pool.loop).

Attach and Detach arrive on the gRPC service's threads and are only queued here; the loop
takes them with the next plan, so every rank adds and removes members at the same point.
"""

import logging
import threading
from dataclasses import dataclass, field

from rlkube.config import TrainerConfig
from rlkube.config.pool import PoolTrainerConfig
from rlkube.scopes import MEMBER_NAME
from rlkube.trainer.pool.fair_share import Candidate, pick, shares
from rlkube.trainer.pool.prober import Prober
from rlkube.trainer.pool.unload import AdapterUnloader
from rlkube.transport.publishers import storage_root
from rlkube.transport.weights_storage import snapshot_location

logger = logging.getLogger(__name__)

@dataclass
class Plan:
    """What every rank does next, in this order."""

    leaves: list[tuple[str, str]] = field(default_factory=list)
    """(member, why) to remove."""
    joins: list[tuple[str, str]] = field(default_factory=list)
    """(member, its TrainerConfig as JSON) to add, resuming from its checkpoint."""
    train: list[str] = field(default_factory=list)
    """Members whose next step to train."""
    stop: bool = False


@dataclass
class Entry:
    name: str
    config: TrainerConfig
    weight: float
    prober: Prober
    joined: bool = False
    step: int = 0
    tokens: int = 0
    """Trained tokens (all ranks) since it joined this process."""
    credit: int = 0
    """Tokens it is credited with on joining (the others' least, weighted), so that a late
    joiner gets its share from then on, not a burst to catch up with the whole past."""


class Roster:
    def __init__(self, config: PoolTrainerConfig, misfit, credential_of):
        """`misfit(TrainerConfig)`: why a member's trainer config does not fit the slot, or None
        (`MultiRunTrainer.misfit`); `credential_of(member)`: the rollouts credential to pull
        from its orchestrator with (None: this process's own)."""
        self.config, self.misfit, self.credential_of = config, misfit, credential_of
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.leaving: list[tuple[str, str]] = []
        self.left: dict[str, str] = {}
        """Why each member that is no longer one left: finished, detached, evicted, failed."""
        self.stopping = False
        urls = config.pool.inference_urls
        self.unloader = AdapterUnloader(urls, self.is_member) if urls else None
        """Unloads the adapters of members that left for good from the pool's inference."""

    # --- from the gRPC service's threads -----------------------------------------------

    def attach(self, name: str, address: str, trainer_config: str, weight: float) -> str:
        """Queue member `name` (ValueError naming the field when it does not fit, OverflowError
        when the pool is full); returns where its step-0 adapter is published when it joins
        without a checkpoint. A member attaching again (its orchestrator restarted) is
        removed first, then added back from its checkpoint."""
        if not MEMBER_NAME.fullmatch(name):
            raise ValueError(f"member: {name!r} is not a lower-case DNS-1123 name (a-z, 0-9, '-', '.')")
        config = self.member_config(name, address, trainer_config)
        with self.lock:
            again = name in self.entries
            if not again and len(self.entries) >= self.config.pool.max_runs:
                raise OverflowError(f"pool.max_runs: the pool trains {self.config.pool.max_runs} members at most "
                                    f"({', '.join(sorted(self.entries))})")
            if again:
                self._leave(name, "attached again")
            prober = Prober(name, address, self.credential_of(name), self.config.pool.probe_interval_s)
            self.entries[name] = Entry(name, config, weight or 1.0, prober, credit=self._least_credit(weight or 1.0))
            self.left.pop(name, None)
        logger.info("member %s attached from %s (weight %g)", name, address, weight or 1.0)
        return snapshot_location(storage_root(config.weights, config.output_dir), 0)

    def detach(self, name: str) -> bool:
        with self.lock:
            if name not in self.entries:
                return False
            self._leave(name, "detached")
            return True

    def member_config(self, name: str, address: str, trainer_config: str) -> TrainerConfig:
        """The member's trainer config as the pool runs it: its own, with its outputs under
        `<output_dir>/members/<name>/` and its batches pulled from `address`."""
        try:
            config = TrainerConfig.model_validate_json(trainer_config)
        except ValueError as e:
            raise ValueError(f"trainer_config: {e}") from None
        if reason := self.misfit(config):
            raise ValueError(reason)
        if config.weights.type != "storage":
            raise ValueError(f"trainer.weights.type: {config.weights.type!r}; a pool member publishes its adapter "
                             "through 'storage' (one weight server per member is not built)")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"orchestrator_address: {address!r} is not host:port")
        rollouts = {"host": host, "port": int(port), "timeout_s": self.config.pool.member_grace_s}
        return config.model_copy(update={"output_dir": self.config.member_dir(name),
                                         "rollouts": config.rollouts.model_copy(update=rollouts)})

    # --- from the loop (rank 0) ----------------------------------------------------------

    def plan(self) -> Plan:
        """Members to remove (left, evicted, restarted) and to add, and the one to train."""
        with self.lock:
            plan = Plan(stop=self.stopping)
            for entry in list(self.entries.values()):
                if entry.prober.restarted:
                    self._leave(entry.name, f"its orchestrator restarted: {entry.prober.restarted}")
                elif entry.prober.silent_for() > self.config.pool.member_grace_s:
                    self._leave(entry.name, f"evicted: its orchestrator did not answer for "
                                            f"{self.config.pool.member_grace_s:g}s (pool.member_grace_s)")
            plan.leaves, self.leaving = self.leaving, []
            for entry in self.entries.values():
                if not entry.joined:
                    plan.joins.append((entry.name, entry.config.model_dump_json()))
                    entry.joined = True
            ready = [Candidate(e.name, e.tokens + e.credit, e.weight) for e in self.entries.values()
                     if e.joined and e.name not in dict(plan.joins) and e.prober.batch_ready_step > e.step]
            if (name := pick(ready)) is not None:
                plan.train.append(name)
            return plan

    def joined(self, name: str, step: int) -> None:
        with self.lock:
            if name in self.entries:
                self.entries[name].step = step

    def trained(self, name: str, step: int, tokens: int) -> None:
        with self.lock:
            if entry := self.entries.get(name):  # not when it detached meanwhile
                entry.step, entry.tokens = step, tokens

    def gone(self, name: str, reason: str) -> None:
        """The loop removed member `name` on its own account (finished, or failed: `reason`)."""
        with self.lock:
            if name in self.entries:
                self.entries.pop(name).prober.close()
            self._left(name, reason)

    def _leave(self, name: str, reason: str) -> None:
        entry = self.entries.pop(name)
        entry.prober.close()
        if entry.joined:
            self.leaving.append((name, reason))
        self._left(name, reason)
        logger.info("member %s leaves: %s", name, reason)

    def _left(self, name: str, reason: str) -> None:
        self.left[name] = reason
        if self.unloader:
            self.unloader.left(name, reason)

    def is_member(self, name: str) -> bool:
        with self.lock:
            return name in self.entries

    def _least_credit(self, weight: float) -> int:
        """The least weighted virtual time of the members, in `weight`'s tokens (0 alone)."""
        times = [(e.tokens + e.credit) / e.weight for e in self.entries.values()]
        return int(min(times) * weight) if times else 0

    def status(self) -> dict:
        """The members, their steps, trained tokens and shares, and why the others left."""
        with self.lock:
            tokens = {name: e.tokens for name, e in self.entries.items()}
            share = shares(tokens)
            return {
                "members": {name: {"step": e.step, "tokens": e.tokens, "weight": e.weight, "share": share[name],
                                   "ready_step": e.prober.batch_ready_step} for name, e in self.entries.items()},
                "left": dict(self.left),
            }

    def stop(self) -> None:
        with self.lock:
            self.stopping = True

    def close(self) -> None:
        with self.lock:
            for entry in self.entries.values():
                entry.prober.close()
            self.entries.clear()
        if self.unloader:
            self.unloader.close()
