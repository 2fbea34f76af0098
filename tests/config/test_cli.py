"""The config loader: merging, flags, and error messages that name the field."""

import subprocess
import sys

import pytest
from rlkube.config import ConfigError, RLConfig, SFTConfig, load_config, parse_cli, to_toml


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_merge_left_to_right_and_flags_win(tmp_path):
    base = write(tmp_path, "base.toml", "max_steps = 10\n[optim]\nlr = 1e-3\nweight_decay = 0.1\n")
    over = write(tmp_path, "over.toml", "[optim]\nlr = 5e-4\n[data]\nloss-roles = ['user', 'assistant']\n")
    config = load_config(SFTConfig, ["@", base, "@", over, "--max-steps", "20"])
    assert config.max_steps == 20
    assert config.optim.lr == 5e-4
    assert config.optim.weight_decay == 0.1  # deep merge keeps the base's sibling key
    assert config.data.loss_roles == ["user", "assistant"]  # kebab-case key accepted


def test_lists_replace_instead_of_merging(tmp_path):
    base = write(tmp_path, "a.toml", "[[orchestrator.envs]]\nid = 'a'\n[[orchestrator.envs]]\nid = 'b'\n")
    over = write(tmp_path, "b.toml", "[[orchestrator.envs]]\nid = 'c'\n")
    config = load_config(RLConfig, ["@", base, "@", over])
    assert [env.id for env in config.orchestrator.envs] == ["c"]


def test_free_form_dict_keys_keep_their_spelling(tmp_path):
    path = write(tmp_path, "env.toml", "[[orchestrator.envs]]\nid = 'x'\nargs = { num-examples = 3 }\n")
    config = load_config(RLConfig, ["@", path])
    assert config.orchestrator.envs[0].args == {"num-examples": 3}


def test_boolean_and_optional_section_flags():
    config = load_config(SFTConfig, ["--bench", "--ckpt", "--wandb.mode", "offline"])
    assert config.bench is True
    assert config.ckpt is not None and config.ckpt.interval is None
    assert config.wandb.mode == "offline"
    config = load_config(SFTConfig, ["--wandb", "--no-wandb", "--no-bench"])
    assert config.wandb is None and config.bench is False
    config = load_config(SFTConfig, ["--ckpt.resume-step=latest"])
    assert config.ckpt.resume_step == "latest"


@pytest.mark.parametrize(
    "argv, field, reason",
    [
        (["--optim.lr", "-1"], "optim.lr", "greater than 0"),
        (["--max-steps", "ten"], "max_steps", "valid integer"),
        (["--scheduler.type", "exponential"], "scheduler.type", "'constant', 'linear' or 'cosine'"),
        (["--ckpt.keep-last", "0"], "ckpt.keep_last", "greater than or equal to 1"),
    ],
)
def test_bad_values_name_the_field(argv, field, reason):
    with pytest.raises(ConfigError) as error:
        load_config(SFTConfig, argv)
    assert f"{field}:" in str(error.value)
    assert reason in str(error.value)


def test_unknown_keys_name_the_path(tmp_path):
    path = write(tmp_path, "bad.toml", "[optim]\nlearning_rate = 1e-3\n")
    with pytest.raises(ConfigError, match=r"optim\.learning_rate: unknown field"):
        load_config(SFTConfig, ["@", path])
    with pytest.raises(ConfigError, match=r"unknown field 'optim\.learning_rate'"):
        load_config(SFTConfig, ["--optim.learning-rate", "1e-3"])


def test_malformed_toml_names_the_file(tmp_path):
    path = write(tmp_path, "broken.toml", "[optim\nlr = 1\n")
    with pytest.raises(ConfigError, match="broken.toml: not valid TOML"):
        load_config(SFTConfig, ["@", path])
    with pytest.raises(ConfigError, match="not found"):
        load_config(SFTConfig, ["@", str(tmp_path / "missing.toml")])


def test_cross_field_rule_names_both_fields():
    with pytest.raises(ConfigError, match=r"batch_size \(12\) must be a multiple of group_size \(8\)"):
        load_config(RLConfig, ["--orchestrator.batch-size", "12", "--orchestrator.group-size", "8"])


def test_process_configs_share_one_definition():
    config = load_config(
        RLConfig, ["--model.name", "m", "--max-steps", "7", "--inference.replicas", "2", "--inference.port", "9000"]
    )
    configs = config.process_configs()
    assert configs["trainer"].model.name == configs["orchestrator"].model.name == configs["inference"].model.name == "m"
    assert configs["trainer"].max_steps == configs["orchestrator"].max_steps == 7
    assert configs["orchestrator"].client.base_urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"]
    assert configs["trainer"].rollouts == configs["orchestrator"].rollouts


def test_explicit_urls_must_match_replicas():
    with pytest.raises(ConfigError, match="base_urls has 1 entries but inference.replicas is 2"):
        load_config(RLConfig, ["--inference.replicas", "2", "--orchestrator.client.base-urls", '["http://a:1"]'])


def test_resolved_toml_round_trips(tmp_path):
    config = load_config(RLConfig, ["--ckpt.interval", "5", "--orchestrator.sampling.temperature", "0.7"])
    path = write(tmp_path, "resolved.toml", to_toml(config))
    assert load_config(RLConfig, ["@", path]) == config


def test_cli_exits_2_with_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_cli(SFTConfig, "sft", ["--optim.lr", "0"])
    assert exit_info.value.code == 2
    assert "optim.lr" in capsys.readouterr().err


def test_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        parse_cli(RLConfig, "rl", ["--help"])
    out = capsys.readouterr().out
    for flag in ("--orchestrator.batch-size", "--trainer.loss.kl-tau", "--ckpt.resume-step", "--inference.replicas"):
        assert flag in out


def test_config_package_imports_no_ml_stack():
    code = (
        "import sys, rlkube.config\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'verifiers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
