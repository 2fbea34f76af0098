"""The local supervisor with cheap fake children (plain Python processes)."""

import os
import signal
import subprocess
import sys
import threading
import time

from rlkube.launch.supervisor import ChildSpec, Supervisor


def sleeper(tmp_path, name, seconds=120, **kw):
    """A child that records its pid, spawns a grandchild in its group, and sleeps."""
    code = (
        "import os, subprocess, sys, time;"
        f"g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})']);"
        f"open(r'{tmp_path}/{name}.pids', 'w').write(f'{{os.getpid()}} {{g.pid}}');"
        f"time.sleep({seconds})"
    )
    return ChildSpec(name, [sys.executable, "-c", code], tmp_path / "logs" / f"{name}.log", **kw)


def exits(tmp_path, name, code, after=0.5, **kw):
    script = f"import time, sys; time.sleep({after}); print('bye'); sys.exit({code})"
    return ChildSpec(name, [sys.executable, "-c", script], tmp_path / "logs" / f"{name}.log", **kw)


def pids(tmp_path, name, timeout=20):
    path = tmp_path / f"{name}.pids"
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{name} never started"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purpose
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def run_in_thread(supervisor, stages):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", supervisor.run(stages)))
    thread.start()
    return thread, result


def test_sigkilled_child_stops_everything_and_fails_fast(tmp_path):
    supervisor = Supervisor(grace_s=2)
    thread, result = run_in_thread(supervisor, [[sleeper(tmp_path, "a"), sleeper(tmp_path, "b")]])
    a, b = pids(tmp_path, "a"), pids(tmp_path, "b")
    killed_at = time.monotonic()
    os.kill(a[0], signal.SIGKILL)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert result["code"] != 0
    assert time.monotonic() - killed_at < 15
    assert not any(alive(p) for p in a + b), "children or grandchildren survived"


def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path):
    stubborn = ChildSpec(
        "stubborn",
        [sys.executable, "-c", (
            "import signal, time, os; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            f"open(r'{tmp_path}/stubborn.pids', 'w').write(str(os.getpid())); time.sleep(120)"
        )],
        tmp_path / "logs" / "stubborn.log",
    )
    supervisor = Supervisor(grace_s=1)
    thread, result = run_in_thread(supervisor, [[stubborn, exits(tmp_path, "failing", 3, after=1.0)]])
    pid = pids(tmp_path, "stubborn")[0]
    thread.join(timeout=30)
    assert result["code"] == 3
    assert not alive(pid)


def test_run_succeeds_once_trainer_and_orchestrator_finished(tmp_path):
    supervisor, ticks = Supervisor(grace_s=2), []
    code = supervisor.run([
        [sleeper(tmp_path, "server"), exits(tmp_path, "trainer", 0, after=0.2, must_finish=True)],
        [exits(tmp_path, "orchestrator", 0, after=1.5, must_finish=True)],
    ], tick=lambda: ticks.append(1))
    assert code == 0
    assert len(ticks) >= 3, "the progress line is ticked while the run goes on"
    assert not any(alive(p) for p in pids(tmp_path, "server"))
    assert (tmp_path / "logs" / "trainer.log").read_text().strip() == "bye"
    assert (tmp_path / "logs" / "orchestrator.log").read_text().strip() == "bye", "waited for the orchestrator"


def test_unexpected_clean_exit_is_a_failure(tmp_path):
    code = Supervisor(grace_s=1).run([[sleeper(tmp_path, "trainer", must_finish=True), exits(tmp_path, "inference-0", 0)]])
    assert code == 1


def test_next_stage_waits_for_health_and_a_death_while_waiting_fails(tmp_path):
    never_healthy = sleeper(tmp_path, "inference-0", health_url="http://127.0.0.1:9/health")
    dying = exits(tmp_path, "trainer", 7, after=1.0)
    started_late = sleeper(tmp_path, "orchestrator")
    code = Supervisor(grace_s=1).run([[never_healthy, dying], [started_late]])
    assert code == 7
    assert not (tmp_path / "orchestrator.pids").exists()


def test_grandchildren_get_the_grace_period_after_their_leader_exits(tmp_path):
    """A worker that cleans up on SIGTERM (a trainer rank finishing a save) is not SIGKILLed
    just because its group leader (torchrun, the vLLM API server) exited first."""
    worker = (
        "import signal, sys, time;"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.8),"
        f" open(r'{tmp_path}/cleaned', 'w').write('yes'), sys.exit(0)));"
        f"open(r'{tmp_path}/ready', 'w').close();"
        "time.sleep(120)"
    )
    leader = ChildSpec(
        "leader",
        [sys.executable, "-c", (
            "import os, subprocess, sys, time;"
            f"g = subprocess.Popen([sys.executable, '-c', {worker!r}]);"
            f"open(r'{tmp_path}/leader.pids', 'w').write(f'{{os.getpid()}} {{g.pid}}');"
            "time.sleep(120)"
        )],
        tmp_path / "logs" / "leader.log",
    )
    # fails once the worker's handler is installed, however slowly Python starts here
    failing = ChildSpec(
        "failing",
        [sys.executable, "-c", (
            "import os, sys, time\n"
            f"while not os.path.exists(r'{tmp_path}/ready'): time.sleep(0.05)\n"
            "sys.exit(3)"
        )],
        tmp_path / "logs" / "failing.log",
    )
    supervisor = Supervisor(grace_s=10)
    thread, result = run_in_thread(supervisor, [[leader, failing]])
    pid, worker_pid = pids(tmp_path, "leader")
    thread.join(timeout=30)
    assert result["code"] == 3
    assert (tmp_path / "cleaned").read_text() == "yes", "the worker was killed during its cleanup"
    assert not alive(pid) and not alive(worker_pid)


def test_a_restartable_child_that_dies_is_started_again_and_the_run_goes_on(tmp_path):
    """An env worker killed mid-run comes back (its log appended) and the run still succeeds."""
    worker = sleeper(tmp_path, "env-worker-0", max_restarts=2)
    supervisor = Supervisor(grace_s=1)
    thread, result = run_in_thread(supervisor, [[exits(tmp_path, "orchestrator", 0, after=8.0, must_finish=True), worker]])
    first = pids(tmp_path, "env-worker-0")
    (tmp_path / "env-worker-0.pids").unlink()
    os.kill(first[0], signal.SIGKILL)
    second = pids(tmp_path, "env-worker-0")
    assert second != first, "started again"
    assert not any(alive(p) for p in first), "what was left of the dead worker's group was killed"
    thread.join(timeout=30)
    assert result["code"] == 0
    assert not any(alive(p) for p in second)


def test_a_child_past_its_restart_limit_fails_the_run(tmp_path):
    code = Supervisor(grace_s=1).run([[sleeper(tmp_path, "trainer", must_finish=True),
                                       exits(tmp_path, "env-worker-0", 3, after=0.1, max_restarts=1)]])
    assert code == 3
    assert (tmp_path / "logs" / "env-worker-0.log").read_text().split() == ["bye", "bye"], "ran twice, then failed"


def test_a_child_exiting_2_is_never_restarted_and_its_error_stops_the_run(tmp_path, caplog):
    """Exit code 2 (an invalid config, a missing model) fails the same way every time."""
    script = "import sys; print(\"rlkube env-worker: error: env.0.id: environment 'nope' does not resolve\"); sys.exit(2)"
    worker = ChildSpec("env-worker-0", [sys.executable, "-c", script], tmp_path / "logs" / "env-worker-0.log",
                       max_restarts=3)
    with caplog.at_level("ERROR", logger="rlkube.launch.supervisor"):
        code = Supervisor(grace_s=1).run([[sleeper(tmp_path, "trainer", must_finish=True), worker]])
    assert code == 2
    assert len((tmp_path / "logs" / "env-worker-0.log").read_text().splitlines()) == 1, "ran once"
    assert "env-worker-0 exited with code 2: rlkube env-worker: error: env.0.id: environment 'nope'" in caplog.text


def test_a_killed_supervisor_leaves_no_child_running(tmp_path):
    """The supervisor SIGKILLed (the OOM killer, `kill -9`) cannot stop its children: the
    kernel SIGTERMs them for it instead of leaving them running (an engine holding its port and
    memory, a trainer its GPU)."""
    child = sleeper(tmp_path, "child")
    script = (
        "import sys; from pathlib import Path; from rlkube.launch.supervisor import ChildSpec, Supervisor;"
        f"Supervisor().run([[ChildSpec('child', {child.argv!r}, Path(r'{child.log_path}'))]])"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script])
    try:
        pid, _ = pids(tmp_path, "child")
        assert alive(pid)
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), "the child outlived its killed supervisor"
    finally:
        for p in pids(tmp_path, "child"):
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_members_failure_stops_its_children_alone_and_the_others_finish(tmp_path):
    """A pool: member a's orchestrator fails; its env worker is stopped at once, member b and
    the pool's servers go on until b finishes; the failure is kept for the exit code."""
    supervisor = Supervisor(grace_s=1)
    thread, result = run_in_thread(supervisor, [[sleeper(tmp_path, "pool-trainer")], [
        exits(tmp_path, "a-orchestrator", 3, after=0.5, must_finish=True, member="a"),
        sleeper(tmp_path, "a-env-worker", member="a"),
        exits(tmp_path, "b-orchestrator", 0, after=6.0, must_finish=True, member="b"),
        sleeper(tmp_path, "b-env-worker", member="b")]])
    a_worker, pool_trainer = pids(tmp_path, "a-env-worker"), pids(tmp_path, "pool-trainer")
    deadline = time.monotonic() + 20
    while any(alive(p) for p in a_worker):
        assert time.monotonic() < deadline, "the failed member's env worker was left running"
        time.sleep(0.1)
    assert all(alive(p) for p in pool_trainer + pids(tmp_path, "b-env-worker")), "the pool and member b go on"
    thread.join(timeout=30)
    assert result["code"] == 0
    assert set(supervisor.failed) == {"a"} and "a-orchestrator exited with code 3" in supervisor.failed["a"]
    assert supervisor.finished == ["b"]
    assert (tmp_path / "logs" / "b-orchestrator.log").read_text().strip() == "bye", "waited for member b"
    assert not any(alive(p) for p in pool_trainer + pids(tmp_path, "b-env-worker"))


def test_a_member_that_finished_has_its_env_workers_stopped_before_the_others_finish(tmp_path):
    supervisor = Supervisor(grace_s=1)
    thread, result = run_in_thread(supervisor, [[sleeper(tmp_path, "pool-trainer")], [
        exits(tmp_path, "a-orchestrator", 0, after=0.5, must_finish=True, member="a"),
        sleeper(tmp_path, "a-env-worker", member="a"),
        exits(tmp_path, "b-orchestrator", 0, after=8.0, must_finish=True, member="b")]])
    a_worker = pids(tmp_path, "a-env-worker")
    deadline = time.monotonic() + 6
    while any(alive(p) for p in a_worker):
        assert time.monotonic() < deadline, "a finished member's env worker outlived its orchestrator"
        time.sleep(0.1)
    assert thread.is_alive(), "member b is still running"
    thread.join(timeout=30)
    assert result["code"] == 0 and supervisor.finished == ["a", "b"] and not supervisor.failed


def test_when_every_member_failed_the_pool_stops(tmp_path):
    supervisor = Supervisor(grace_s=1)
    code = supervisor.run([[sleeper(tmp_path, "pool-trainer")],
                           [exits(tmp_path, "a-orchestrator", 1, after=0.3, must_finish=True, member="a")]])
    assert code == 0 and set(supervisor.failed) == {"a"}
    assert not any(alive(p) for p in pids(tmp_path, "pool-trainer"))
