"""The reverse-text cluster scenario with another setting (`RLKUBE_E2E_RL_SET`,
e2e/scenarios/reverse_text.py): the overrides reach the configs the operator writes for the
run's pods, over the scenario's own RL config, and none are applied when it is unset."""

import tomllib

from rlkube_operator import wiring
from rlkube_operator.names import RunRef
from rlkube_operator.spec import RLRunSpec

from e2e.scenarios.manifests import short_rl
from e2e.scenarios.reverse_text import RL_CONFIG, RL_SET_ENV, env_overrides

RUN = RunRef("RLRun", "reverse-text", "rlkube-e2e", "0f1e-uid")


def trainer_toml(config: dict) -> dict:
    """The trainer pod's config of the scenario's RLRun with `config`."""
    run = short_rl("reverse-text", "/data/sft/weights/final", "reverse-text-shared", 36, **config)
    return tomllib.loads(wiring.rl_tomls(RUN, RLRunSpec.model_validate(run["spec"]))["trainer.toml"])


def with_setting(monkeypatch, setting: str | None) -> dict:
    """The trainer pod's config of the scenario as it runs with `setting` in the environment."""
    if setting is None:
        monkeypatch.delenv(RL_SET_ENV, raising=False)
    else:
        monkeypatch.setenv(RL_SET_ENV, setting)
    return trainer_toml(RL_CONFIG | env_overrides())


def test_nixl_reaches_the_trainer_over_the_scenarios_config(monkeypatch):
    trainer = with_setting(monkeypatch, 'weights.type = "nixl"\nweights.nixl_transports=["tcp"]\n')
    assert trainer["weights"]["type"] == "nixl" and trainer["weights"]["nixl_transports"] == ["tcp"]
    assert trainer["weights"]["grpc_bind_host"] == "0.0.0.0", "the operator's wiring for nixl"
    assert trainer["optim"] == RL_CONFIG["trainer.optim"], "the scenario's own settings stay"


def test_delta_reaches_the_trainer(monkeypatch):
    trainer = with_setting(monkeypatch, "weights.delta={full_every=10}")
    assert trainer["weights"]["delta"] == {"full_every": 10}
    assert trainer["weights"].get("type", "storage") == "storage"


def test_unset_leaves_the_scenario_as_it_is(monkeypatch):
    assert with_setting(monkeypatch, None) == with_setting(monkeypatch, "\n") == trainer_toml(RL_CONFIG)
