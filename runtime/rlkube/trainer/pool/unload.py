"""Rank 0 unloads the adapter of a member that left for good (failed, detached, evicted) from
every replica of the pool's inference, so that its slot (one of `max_loras`) is free for the
next member. With the pool's own admin credential (the pool trainer holds the pool's token).

Off the loop's thread: a replica that is slow or down must not hold the others' steps. A member
that attached again before its unload ran is left loaded (its orchestrator loads its adapter
again on joining, perhaps already). A finished member is not unloaded here: its orchestrator
still evaluates its last policy; it may unload its own with its member admin credential.
"""

import asyncio
import logging
import queue
import threading

from rlkube.inference import client

logger = logging.getLogger(__name__)

UNLOAD_TIMEOUT_S = 30.0
LEFT_FOR_GOOD = ("failed", "detached", "evicted")
"""How the reasons of a member that is not coming back by itself begin (rlkube.trainer.pool.roster)."""


class AdapterUnloader:
    def __init__(self, inference_urls: list[str], is_member):
        """`is_member(name)`: whether `name` is a member again (then its adapter stays)."""
        self.urls, self.is_member = list(inference_urls), is_member
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="adapter-unloader", daemon=True)
        self.thread.start()

    def left(self, name: str, reason: str) -> None:
        """Member `name` left for `reason`: unload its adapter when it left for good."""
        if reason.startswith(LEFT_FOR_GOOD):
            self.queue.put(name)

    def _run(self) -> None:
        while (name := self.queue.get()) is not None:
            if not self.is_member(name):
                asyncio.run(self._unload(name))

    async def _unload(self, name: str) -> None:
        for url in self.urls:
            try:
                logger.info("member %s: %s: %s", name, url, await client.unload_adapter(url, name, UNLOAD_TIMEOUT_S))
            except client.InferenceError as e:  # a replica down loses its adapters anyway
                logger.warning("member %s: unloading its adapter failed: %s", name, e)

    def close(self, timeout_s: float = UNLOAD_TIMEOUT_S) -> None:
        """Finish the unloads queued (each replica's at most UNLOAD_TIMEOUT_S), then stop."""
        self.queue.put(None)
        self.thread.join(timeout_s)
