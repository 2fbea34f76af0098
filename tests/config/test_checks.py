"""Configs that would train on biased log-probs, on nothing, or on something that is not there
are refused by the CLI before anything starts (`--dry-run` included), naming field and reason."""

import pytest
from rlkube.config import RLConfig
from rlkube.entrypoints.eval import main as eval_main
from rlkube.entrypoints.rl import main as rl_main

from tests.fixtures.hub import hub_offline


def refusal(capsys, main, argv) -> str:
    """The error `main` prints when it refuses `argv` (as `rlkube ... --dry-run`)."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--dry-run"])
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return str(tmp_path / "model")


@pytest.mark.parametrize(
    "argv, field, reason",
    [
        (["--orchestrator.sampling.temperature", "0"], "orchestrator.sampling", "temperature (0) must be > 0 for training"),
        (["--orchestrator.sampling.top-p", "0.9"], "orchestrator.sampling", "top_p (0.9) must be 1 for training"),
        (["--orchestrator.group-size", "1", "--orchestrator.batch-size", "4"], "orchestrator",
         "group_size 1 with the group-mean baseline makes every advantage zero"),
        (["--inference.max-model-len", "256", "--orchestrator.seq-len", "512"], "(top level)",
         "inference.max_model_len (256) is shorter than orchestrator.seq_len (512)"),
        (["--inference.max-model-len", "512", "--orchestrator.seq-len", "256", "--orchestrator.sampling.max-tokens", "512"],
         "(top level)", "orchestrator.sampling.max_tokens (512) leaves no room for a prompt"),
    ],
)
def test_training_settings_that_cannot_train_are_refused(capsys, tmp_path, model_dir, argv, field, reason):
    err = refusal(capsys, rl_main, ["--output-dir", str(tmp_path / "run"), "--model.name", model_dir, *argv])
    assert f"{field}: {reason}" in err
    assert not (tmp_path / "run").exists(), "refused before any config was written"


@pytest.mark.parametrize("knob", ["top_k = 20", "min_p = 0.1"])
def test_truncated_sampling_is_refused(capsys, tmp_path, model_dir, knob):
    config = tmp_path / "rl.toml"
    config.write_text(f"[orchestrator.sampling]\ntemperature = 0.7\n{knob}\n")
    err = refusal(capsys, rl_main, ["@", str(config), "--model.name", model_dir])
    assert f"orchestrator.sampling: {knob.split()[0]}: not supported" in err
    assert "truncated sampling would make them disagree" in err


def test_eval_may_sample_greedily_or_truncated(tmp_path, model_dir):
    config = RLConfig.model_validate({
        "model": {"name": model_dir},
        "orchestrator": {"eval": {"sampling": {"temperature": 0, "top_p": 0.9}}},
    })
    assert config.orchestrator.eval.sampling.top_p == 0.9
    assert rl_main(["--output-dir", str(tmp_path / "run"), "--model.name", model_dir,
                    "--orchestrator.eval.sampling.top-p", "0.9", "--dry-run"]) == 0


def test_an_environment_that_does_not_resolve_is_refused(capsys, tmp_path, model_dir):
    config = tmp_path / "rl.toml"
    config.write_text("[[orchestrator.envs]]\nid = 'reverse_text'\n[[orchestrator.envs]]\nid = 'no_such_env_xyz'\n")
    err = refusal(capsys, rl_main, ["@", str(config), "--model.name", model_dir, "--output-dir", str(tmp_path / "run")])
    assert "orchestrator.envs.1.id: environment 'no_such_env_xyz' does not resolve" in err
    assert "orchestrator.envs.0" not in err


@pytest.mark.parametrize("name", ["/no/such/model", "./no-such-model", "no/such/model", "outputs/no-such-model"])
def test_a_missing_local_model_directory_is_refused(capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()  # `outputs/...` reads as a local path once outputs/ exists
    err = refusal(capsys, eval_main, ["--model.name", name, "--output-dir", str(tmp_path / "eval")])
    assert f"model.name: '{name}' does not exist" in err


def test_a_directory_without_a_model_config_is_refused(capsys, tmp_path):
    """An empty directory (a volume mounted but never filled, the wrong subdirectory) is refused
    here, exit code 2, not by a trainer that would crash on it with 1 and be restarted."""
    (tmp_path / "weights").mkdir()
    err = refusal(capsys, eval_main, ["--model.name", str(tmp_path / "weights"), "--output-dir", str(tmp_path / "eval")])
    assert f"model.name: '{tmp_path / 'weights'}' has no config.json" in err


@pytest.mark.parametrize("name", ["Qwen/Qwen3-0.6B", "gpt2", "outputs/tiny-model"])
def test_hub_ids_are_not_taken_for_missing_paths(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # no outputs/ here: `outputs/tiny-model` may be a hub id
    hub_offline(monkeypatch)  # else each name not in the offline table waits out the hub's timeout
    assert rl_main(["--output-dir", str(tmp_path / "run"), "--model.name", name, "--dry-run"]) == 0


@pytest.mark.parametrize("command, section", [("rl", "trainer."), ("sft", "")])
def test_lora_targets_that_name_no_linear_layer_of_the_model_are_refused(capsys, tmp_path, tiny_model, command, section):
    from rlkube.entrypoints.sft import main as sft_main

    main = {"rl": rl_main, "sft": sft_main}[command]
    argv = ["--output-dir", str(tmp_path / "run"), "--model.name", str(tiny_model)]
    err = refusal(capsys, main, [*argv, f"--{section}lora.target-modules", '["q_proj", "qkv"]'])
    assert f"{section}lora.target_modules: ['qkv'] name no linear layer of Qwen3ForCausalLM" in err
    assert "'q_proj'" in err.split("its linear layers:")[1], "the error lists the layers there are"
    assert not (tmp_path / "run").exists()
    assert main([*argv, f"--{section}lora.rank", "8", "--dry-run"]) == 0, "the default targets are the model's"
