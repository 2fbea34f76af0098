"""ASGI middleware for vLLM's server: pause generation before the server takes its first request.

vLLM 0.32 has no option to start paused. This middleware sees the ASGI lifespan: when vLLM's
app reports its startup complete (the engine is up), it pauses the engine's scheduler first, so
uvicorn accepts no connection before the pause. Requests then queue until the orchestrator has
brought the server to the current policy and resumed it (`inference.start_paused`;
`rlkube.orchestrator.inference.InferencePool.resync`). An inference pod that restarts mid-run
therefore never generates on the base model's weights. Added with vLLM's `--middleware` option.
"""

import logging

logger = logging.getLogger(__name__)


class StartPaused:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def pause_before_startup_completes(message):
            if message["type"] == "lifespan.startup.complete":
                # "keep": nothing is scheduled until /resume, not even a request already queued.
                await scope["app"].state.engine_client.pause_generation(mode="keep", clear_cache=False)
                logger.info("generation paused until an orchestrator loads the policy and resumes it")
            await send(message)

        await self.app(scope, receive, pause_before_startup_completes)
