"""Config files across rlkube versions: every TOML rlkube writes says which rlkube wrote it, a
field this runtime does not know is reported with both versions, and a file with only the set
fields resolves to the same config as one with every field."""

import pytest
from rlkube.config import ConfigError, RLConfig, SFTConfig, load_config, to_toml
from rlkube.config import cli as config_cli


def _load(tmp_path, model, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(model, ["@", str(path)])


def test_every_toml_rlkube_writes_names_its_version(tmp_path):
    text = to_toml(SFTConfig(max_steps=3))
    assert text.splitlines()[0] == f"# written by rlkube {config_cli.RLKUBE_VERSION}"
    (tmp_path / "hand-written.toml").write_text("max_steps = 3\n")
    assert config_cli.written_by(tmp_path / "hand-written.toml") is None
    assert _load(tmp_path, SFTConfig, text).max_steps == 3


def test_an_unknown_field_in_a_file_of_another_rlkube_names_both_versions(tmp_path):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, SFTConfig, "# written by rlkube 2.0.0\nmax_steps = 3\n[data]\nshards = 4\n")
    assert str(error.value) == (
        "invalid config:\n  data.shards: unknown field: the config was written by rlkube 2.0.0 and this runtime"
        f" is rlkube {config_cli.RLKUBE_VERSION} (run an image of rlkube 2.0.0, or leave the field unset)")


def test_an_unknown_field_in_a_hand_written_file_is_a_plain_typo(tmp_path):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, SFTConfig, "max_step = 3\n")
    assert str(error.value) == "invalid config:\n  max_step: unknown field"


def test_only_the_set_fields_resolve_to_the_same_process_configs(tmp_path):
    config = RLConfig.model_validate({"max_steps": 9, "weights": {"type": "nccl"}, "inference": {"replicas": 2},
                                      "trainer": {"optim": {"lr": 1e-3}}})
    sparse, full = config.process_configs(exclude_unset=True), config.process_configs()
    for name, process in sparse.items():
        text = to_toml(process, exclude_unset=True)
        assert "optim" not in text or name == "trainer"
        assert _load(tmp_path, type(process), text).model_dump() == full[name].model_dump(), name
    assert "max_model_len" not in to_toml(sparse["inference"], exclude_unset=True)
    assert sparse["trainer"].weights.inference_urls == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
