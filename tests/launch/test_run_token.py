"""`rlkube rl` gives each child the run's credentials its component holds, derived from one
token per run: the same credential for the same scope in every child, a new token for every
run, and never the token itself nor another component's scopes (`rlkube.scopes.HELD`)."""

import dataclasses
import json
import sys

from rlkube.auth import TOKEN_ENV
from rlkube.config import RLConfig
from rlkube.launch.local import child_stages, write_process_configs
from rlkube.launch.supervisor import Supervisor
from rlkube.scopes import HELD, SCOPES, scope_env, scoped

REPORT_CREDENTIALS = ("import json, os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(json.dumps("
                      "{k: v for k, v in os.environ.items() if k.startswith('RLKUBE_TOKEN')}))")


def credentials_children_see(config: RLConfig, tmp_path, run: str) -> dict[str, dict[str, str]]:
    """Start every child of a run as a process that writes down the credentials it was given."""
    stages = child_stages(config, write_process_configs(config))
    seen = tmp_path / run
    seen.mkdir()
    reporters = [
        [dataclasses.replace(spec, argv=[sys.executable, "-c", REPORT_CREDENTIALS, str(seen / spec.name)],
                             health_url=None, must_finish=True) for spec in stage]
        for stage in stages
    ]
    assert Supervisor().run(reporters) == 0
    return {path.name: json.loads(path.read_text()) for path in seen.iterdir()}


def component(child: str) -> str:
    return child.rsplit("-", 1)[0] if child[-1].isdigit() else child


def test_each_child_gets_its_components_credentials_from_a_fresh_token(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    config = RLConfig(output_dir=tmp_path / "out", inference={"replicas": 2}, orchestrator={"env_workers": 1})
    first = credentials_children_see(config, tmp_path, "first")
    assert set(first) == {"inference-0", "inference-1", "trainer", "orchestrator", "env-worker-0"}
    by_scope: dict[str, set[str]] = {}
    for child, credentials in first.items():
        assert set(credentials) == {scope_env(s) for s in HELD[component(child)]}, child
        for name, value in credentials.items():
            by_scope.setdefault(name, set()).add(value)
    assert all(len(values) == 1 for values in by_scope.values()), "a scope's credential differs between children"
    assert len({v for values in by_scope.values() for v in values}) == len(by_scope) == len(SCOPES)
    second = credentials_children_see(config, tmp_path, "second")
    assert {v for c in second.values() for v in c.values()}.isdisjoint(
        {v for c in first.values() for v in c.values()}), "a new run reused the last run's credentials"


def test_a_token_set_by_the_user_is_the_runs(tmp_path, monkeypatch):
    """So that a server started by hand (`rlkube inference` with the same `RLKUBE_TOKEN`, from
    which it derives every scope) can serve the run; the children get their scopes, not it."""
    monkeypatch.setenv(TOKEN_ENV, "chosen-by-the-user")
    config = RLConfig(output_dir=tmp_path / "out")
    for child, credentials in credentials_children_see(config, tmp_path, "run").items():
        assert credentials == {scope_env(s): scoped("chosen-by-the-user", s) for s in HELD[component(child)]}, child
