"""A small local process supervisor: start children, watch them, stop them all together.

Each child runs in its own session (process group), so stopping it reaches everything it
spawned (vLLM's engine core, torchrun's workers), and a Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in order; a supervisor that is itself killed
(SIGKILL: the OOM killer, `kill -9`) cannot, so the kernel SIGTERMs each child for it
(`die_with_parent`) rather than leave a trainer or an engine holding its port, memory and
GPU. If any child dies unexpectedly (SIGKILL
included) the others are stopped and the supervisor reports failure within seconds, except a
child declared restartable (an env worker, whose lost rollouts the orchestrator re-issues; a judge
replica, whose rollouts wait for it): it is
started again after a backoff, like a Deployment's pod, up to its restart limit. A child of a
pool's member run (`ChildSpec.member`: its orchestrator, its env workers) fails that member
alone: its other children are stopped, the failure is kept (`Supervisor.failed`) and the
others go on; the run then ends with exit code 1 once everything else finished.
"""

import logging
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlkube.child_process import die_with_parent
from rlkube.config.cli import EXIT_INVALID
from rlkube.withheld import CREDENTIAL_ENVS, TOKEN_ENV

logger = logging.getLogger(__name__)

class ChildFailed(RuntimeError):
    """A child exited when it should not have; `detail`: the error it left in its log."""

    def __init__(self, name: str, returncode: int, detail: str = ""):
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        super().__init__(f"{name} {how}" + (f": {detail}" if detail else ""))
        self.name, self.returncode = name, returncode


@dataclass
class ChildSpec:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    """Added to the supervisor's environment."""
    health_url: str | None = None
    """Polled until it answers 200 before the next children start."""
    must_finish: bool = False
    """The run succeeds once every such child exited with code 0 (trainer, orchestrator);
    any other exit of any child is a failure."""
    max_restarts: int = 0
    """Times the child is started again after an exit (backoff 1, 2, 4, ... 30 s) before its
    exit fails the run."""
    member: str | None = None
    """A pool member's child: its failure fails that member alone (its other children are
    stopped), and once its `must_finish` children finished its other children are stopped."""


def _without_run_credentials(environ) -> dict[str, str]:
    """The supervisor's environment less the run's token and credentials: each child gets those
    its component holds from its `ChildSpec.env` alone (`rlkube.scopes.HELD`)."""
    return {k: v for k, v in environ.items() if k not in (TOKEN_ENV, *CREDENTIAL_ENVS)}


class Child:
    def __init__(self, spec: ChildSpec, restarts: int = 0):
        self.spec, self.restarts = spec, restarts
        self.restart_at: float | None = None
        """When an exited restartable child is started again (monotonic seconds)."""
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(spec.log_path, "ab")  # noqa: SIM115 (open while the child runs)
        self.process = subprocess.Popen(
            spec.argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**_without_run_credentials(os.environ), **spec.env},
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 (one prctl call, resolved before the fork)
        )
        logger.info("started %s (pid %d): %s", spec.name, self.process.pid, " ".join(spec.argv))

    def poll(self) -> int | None:
        return self.process.poll()

    def running(self) -> bool:
        """The child or anything left in its process group is still alive."""
        return self.poll() is None or _group_has_live_members(self.process.pid)

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.log.close()


class Supervisor:
    """`Supervisor(grace_s).run([[specs started together], [then these], ...])` → exit code."""

    def __init__(self, grace_s: float = 10.0, poll_s: float = 0.2):
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.children: list[Child] = []
        self.failed: dict[str, str] = {}
        """Pool members that failed, with why (the first child's failure)."""
        self.finished: list[str] = []
        """Pool members whose `must_finish` children all exited 0."""

    def run(self, stages: list[list[ChildSpec]], health_timeout_s: float = 600.0, tick: Callable[[], None] | None = None) -> int:
        """`tick` is called every poll while the last stage runs (the console progress line)."""
        try:
            for stage in stages:
                started = [self._start(spec) for spec in stage]
                for child in started:
                    if child.spec.health_url:
                        self._wait_healthy(child, health_timeout_s)
            return self._watch(tick or (lambda: None))
        except ChildFailed as e:
            logger.error("%s; stopping all processes (logs: %s)", e, self._log_dir())
            return e.returncode if e.returncode > 0 else 1
        except KeyboardInterrupt:
            logger.warning("interrupted; stopping all processes")
            return 130
        finally:
            self.stop_all()

    def _start(self, spec: ChildSpec) -> Child:
        child = Child(spec)
        self.children.append(child)
        return child

    def _log_dir(self) -> Path | None:
        return self.children[0].spec.log_path.parent if self.children else None

    def _check_children(self) -> bool:
        """Raise ChildFailed for an unexpected exit (restart a restartable child instead; a
        member's child fails its member alone); True when the run is finished."""
        for i, child in enumerate(self.children):
            code = child.poll()
            if code is None or (code == 0 and child.spec.must_finish) or child.spec.member in self.failed:
                continue
            try:
                if code == EXIT_INVALID:  # an invalid config or a missing model: no restart fixes it
                    raise ChildFailed(child.spec.name, code, _last_line(child.spec.log_path))
                if child.restarts >= child.spec.max_restarts:
                    raise ChildFailed(child.spec.name, code)
            except ChildFailed as e:
                if child.spec.member is None:
                    raise
                logger.error("member %s failed: %s (log: %s); the others go on", child.spec.member, e, child.spec.log_path)
                self.failed[child.spec.member] = str(e)
                continue
            self.children[i] = self._restart(child, code)
        self._retire_members()
        must_finish = [c for c in self.children if c.spec.must_finish]
        return all(c.poll() == 0 for c in must_finish) and bool(must_finish or self.failed or self.finished)

    def _retire_members(self) -> None:
        """Stop the children of each member that failed or finished (an env worker outlives its
        orchestrator otherwise, and would fail its member after the fact)."""
        members = {c.spec.member for c in self.children if c.spec.member is not None}
        for member in members:
            own = [c for c in self.children if c.spec.member == member]
            done = all(c.poll() == 0 for c in own if c.spec.must_finish) and any(c.spec.must_finish for c in own)
            if member not in self.failed and not done:
                continue
            if done and member not in self.failed:
                self.finished.append(member)
                logger.info("member %s finished", member)
            self._stop(own)
            self.children = [c for c in self.children if c not in own]

    def _restart(self, child: Child, code: int) -> Child:
        """The same child again once its backoff has passed (what is left of its group first)."""
        now = time.monotonic()
        if child.restart_at is None:
            child.restart_at = now + min(2.0 ** child.restarts, 30.0)
            logger.warning("%s; restarting it in %.0f s (restart %d of %d)", ChildFailed(child.spec.name, code),
                           child.restart_at - now, child.restarts + 1, child.spec.max_restarts)
            child.signal_group(signal.SIGKILL)
        if now < child.restart_at:
            return child
        child.close()
        return Child(child.spec, restarts=child.restarts + 1)

    def _wait_healthy(self, child: Child, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not _answers_ok(child.spec.health_url):
            self._check_children()
            if time.monotonic() > deadline:
                raise ChildFailed(f"{child.spec.name} (not healthy after {timeout_s:g}s)", 1)
            time.sleep(max(self.poll_s, 0.5))
        logger.info("%s is healthy", child.spec.name)

    def _watch(self, tick: Callable[[], None]) -> int:
        while not self._check_children():
            tick()
            time.sleep(self.poll_s)
        return 0

    def stop_all(self) -> None:
        """SIGTERM every group (newest first), SIGKILL what is left after the grace period.

        Groups whose leader already died are signalled too: a SIGKILLed vLLM server or
        torchrun agent can leave workers behind in its group."""
        self._stop(list(reversed(self.children)))
        self.children.clear()

    def _stop(self, children: list[Child]) -> None:
        for child in children:
            child.signal_group(signal.SIGTERM)
        self._wait_for(children, self.grace_s)
        for child in children:
            child.signal_group(signal.SIGKILL)
        self._wait_for(children, 5.0)
        for child in children:
            child.close()

    @staticmethod
    def _wait_for(children: list[Child], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(c.running() for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)


def _group_has_live_members(pgid: int) -> bool:
    """Whether a process group still has a member that is not a zombie.

    A signal is delivered at once but acted on when the process next runs, so a grandchild can
    outlive its signalled group leader by a moment on a loaded machine. Orphaned zombies are
    reaped by whoever is PID 1, which in a container may never do it, so they do not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def install_sigterm_as_interrupt() -> Callable[[], None]:
    """A SIGTERM to the supervisor stops the children like Ctrl-C does; returns an undo."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _last_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-blank line of a child's log (where its error is when it exits 2)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")
