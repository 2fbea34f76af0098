"""Start `rlkube inference` as a child process and stop it cleanly (used by `rlkube eval`,
the test fixture and the weight benchmark).

The child gets its own process group, so stopping it also stops vLLM's engine-core and worker
processes, and it is SIGTERMed if this process dies first (Linux `PR_SET_PDEATHSIG`), so a
killed parent never leaves an engine behind.
"""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from rlkube.child_process import die_with_parent
from rlkube.config import InferenceConfig, write_toml


def ensure_port_free(host: str, port: int, field: str = "inference.port") -> None:
    """Refuse to start a server on a taken port: `/health` of another server there would
    otherwise look like ours coming up (and the run would train against it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
        try:
            probe.bind((host, port))
        except OSError as e:
            raise RuntimeError(f"{field}: {host}:{port} is in use ({e.strerror})") from None


class InferenceProcess:
    """One `rlkube inference` child. `with InferenceProcess(...) as server:` starts it (not yet
    healthy: call `wait_until_healthy`) and always stops it."""

    def __init__(self, config: InferenceConfig, workdir: Path, env: dict[str, str] | None = None,
                 netns: str | None = None):
        """`netns`: run the server in that network namespace (`ip netns exec`), as in a pod of
        its own (the weight benchmark); its port is then not checked from here."""
        self.config, self.netns = config, netns
        self.workdir = Path(workdir)
        self.env = {**os.environ, **(env or {})}
        self.log = self.workdir / "logs" / "inference.log"
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> Self:
        if self.netns is None:
            ensure_port_free(self.config.host, self.config.port)
        config_file = self.workdir / "configs" / "inference.toml"
        write_toml(self.config, config_file)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "rlkube.entrypoints.inference", "@", str(config_file)]
        if self.netns is not None:
            command = ["ip", "netns", "exec", self.netns, *command]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads yet at fork in callers)
            )
        return self

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    async def wait_until_healthy(self, timeout: float | None = None) -> None:
        """Return once `/health` answers; RuntimeError (with the log's tail) if the process
        exits or `timeout` (default: `startup_timeout_s`) passes first."""
        from rlkube.inference.client import is_healthy

        timeout = self.config.startup_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not await is_healthy(self.base_url):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"rlkube inference exited with {self.process.returncode} "
                    f"(log: {self.log}):\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"rlkube inference not healthy after {timeout:g}s (log: {self.log}):\n{self.log_tail()}")
            await asyncio.sleep(1)

    def stop(self, grace: float = 30) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
