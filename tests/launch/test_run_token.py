"""`rlkube rl` gives its children one token per run: each process started by the supervisor
finds the same `RLKUBE_TOKEN` in its environment, a new one for every run."""

import dataclasses
import sys

from rlkube.auth import TOKEN_ENV
from rlkube.config import RLConfig
from rlkube.launch.local import child_stages, write_process_configs
from rlkube.launch.supervisor import Supervisor

REPORT_TOKEN = "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(os.environ.get('RLKUBE_TOKEN', ''))"


def tokens_children_see(config: RLConfig, tmp_path, run: str) -> dict[str, str]:
    """Start every child of a run as a process that writes down the token it was given."""
    stages = child_stages(config, write_process_configs(config))
    seen = tmp_path / run
    seen.mkdir()
    reporters = [
        [dataclasses.replace(spec, argv=[sys.executable, "-c", REPORT_TOKEN, str(seen / spec.name)],
                             health_url=None, must_finish=True) for spec in stage]
        for stage in stages
    ]
    assert Supervisor().run(reporters) == 0
    return {path.name: path.read_text() for path in seen.iterdir()}


def test_every_child_of_a_run_gets_the_same_fresh_token(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    config = RLConfig(output_dir=tmp_path / "out", inference={"replicas": 2}, orchestrator={"env_workers": 1})
    first = tokens_children_see(config, tmp_path, "first")
    assert set(first) == {"inference-0", "inference-1", "trainer", "orchestrator", "env-worker-0"}
    assert len(set(first.values())) == 1 and len(next(iter(first.values()))) >= 32
    second = tokens_children_see(config, tmp_path, "second")
    assert set(second.values()).isdisjoint(first.values()), "a new run reused the last run's token"


def test_a_token_set_by_the_user_is_the_runs(tmp_path, monkeypatch):
    """So that a server started by hand (`rlkube inference` with the same token) can serve the run."""
    monkeypatch.setenv(TOKEN_ENV, "chosen-by-the-user")
    config = RLConfig(output_dir=tmp_path / "out")
    assert set(tokens_children_see(config, tmp_path, "run").values()) == {"chosen-by-the-user"}
