"""`OrchestratorConfig.pool`: a member run's orchestrator, refused where a member cannot be."""

import pytest
from pydantic import ValidationError
from rlkube.config import OrchestratorConfig, load_config, to_toml

MEMBER = {"member": "team-a.lr-3e-4", "trainer": "pool-trainer:50070", "trainer_config": "trainer.toml"}


def test_a_solo_run_has_no_pool_section():
    assert OrchestratorConfig().pool is None


def test_a_member_names_its_adapter_by_its_member_name():
    config = OrchestratorConfig(pool=MEMBER)
    assert config.client.lora_adapter == "team-a.lr-3e-4"
    assert config.pool.weight == 1.0 and config.pool.address is None
    assert OrchestratorConfig(pool=MEMBER, client={"lora_adapter": "team-a.lr-3e-4"}).client.lora_adapter == "team-a.lr-3e-4"


def test_a_member_config_reads_back_from_its_toml(tmp_path):
    path = tmp_path / "orchestrator.toml"
    path.write_text(to_toml(OrchestratorConfig(pool=MEMBER | {"weight": 2.0}), exclude_unset=True))
    config = load_config(OrchestratorConfig, ["@", str(path)])
    assert config.pool.member == "team-a.lr-3e-4" and config.pool.weight == 2.0
    assert config.client.lora_adapter == "team-a.lr-3e-4"


@pytest.mark.parametrize(("fields", "named"), [
    ({"client": {"lora_adapter": "rlkube-policy"}}, "client.lora_adapter"),
    ({"weights": {"type": "grpc"}}, "weights.type"),
    ({"pool": MEMBER | {"member": "Team_A"}}, "member"),
    ({"pool": MEMBER | {"trainer": "no-port"}}, "trainer"),
    ({"pool": MEMBER | {"address": "host:port"}}, "address"),
    ({"pool": MEMBER | {"weight": 0}}, "weight"),
])
def test_what_a_member_cannot_have_is_refused_naming_the_field(fields, named):
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")):
        OrchestratorConfig(**({"pool": MEMBER} | fields))
