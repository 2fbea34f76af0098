"""A `serve` for `serve_main` (how `rlkube orchestrator` and `rlkube env-worker` start) that runs
one program through verifiers' subprocess runtime, as an environment's agent, tool server or
verifier does, and prints what the program saw: its own environment, then its parent's (the
serving process's original environment, `/proc/<ppid>/environ`)."""

from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

PROGRAM = "env; echo '--- parent'; tr '\\0' '\\n' < /proc/$PPID/environ"


async def serve(config) -> None:
    runtime = SubprocessRuntime(SubprocessConfig())
    await runtime.start()
    try:
        result = await runtime.run(["sh", "-c", PROGRAM], {})
    finally:
        await runtime.teardown()
    print(result.stdout + result.stderr, flush=True)
