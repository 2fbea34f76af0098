"""Rank 0's view of one member's orchestrator: a thread asking its status every interval, so
that the scheduler knows, without waiting on anyone, whose next batch is ready and who has
stopped answering."""

import logging
import threading
import time

from rlkube.transport.client import OrchestratorRestarted, RolloutClient, RolloutError

logger = logging.getLogger(__name__)


class Prober:
    def __init__(self, name: str, address: str, credential: str | None, interval_s: float):
        self.name, self.interval_s = name, interval_s
        self.client = RolloutClient(address, timeout_s=interval_s * 4, credential=credential)
        self.batch_ready_step = 0
        self.last_seen = time.monotonic()
        """When its orchestrator last answered (attaching counts as an answer)."""
        self.restarted: str | None = None
        """Why its orchestrator is another instance than the one first answering, if it is."""
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"probe-{name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                status = self.client.status(timeout_s=self.interval_s * 4)
            except OrchestratorRestarted as e:
                self.restarted = str(e)
                return
            except (RolloutError, ValueError) as e:  # ValueError: its channel was closed
                if self.stopping.is_set():
                    return
                self.batch_ready_step = 0  # not ready while it does not answer: never picked then
                logger.debug("member %s: no status (%s)", self.name, e)
            else:
                self.batch_ready_step = status.batch_ready_step
                self.last_seen = time.monotonic()
            self.stopping.wait(self.interval_s)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_seen

    def close(self) -> None:
        """Stop asking (closing the channel cancels a call in flight: nothing waits on it)."""
        self.stopping.set()
        self.client.close()
