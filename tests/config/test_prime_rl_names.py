"""prime-rl's current key names (`[[orchestrator.train.env]]`, `[orchestrator.train.sampling]`
with `max_completion_tokens`, `[[orchestrator.eval.env]]`, `rollouts_per_example`,
`training_mode`, top-level `seq_len`) are read as rlkube's with a warning naming the key to
write, in TOML, on the CLI and in an RLRun's `spec.config`; the keys rlkube has no equivalent
for are refused with the reason."""

import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
from rlkube.config import ConfigError, RLConfig, load_config
from rlkube.config.renames import RenamedKeyWarning
from rlkube_operator.spec import RLRunSpec

from tests.operator.test_crds import schema_errors
from tests.operator.test_operator_kmock import example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text" / "prime_rl.toml"
# prime-rl's examples/basic/reverse-text/rl.toml as it is upstream: a verifiers v1 env block and a renderer.
UPSTREAM = """
max_steps = 20
seq_len = 2048
[model]
name = "PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT"
[wandb]
project = "reverse-text"
name = "reverse-text"
[orchestrator]
batch_size = 128
group_size = 16
[orchestrator.train.sampling]
max_completion_tokens = 128
[[orchestrator.train.env]]
name = "reverse-text"
env.taskset = { id = "reverse-text-v1" }
env.agent.harness = { id = "null", runtime = { type = "subprocess" } }
[trainer.optim]
lr = 3e-6
[ckpt]
[inference]
[orchestrator.renderer]
name = "prime-qwen3"
"""


def rlkube(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "rlkube.entrypoints.main", *map(str, args)],
                          check=False, capture_output=True, text=True, timeout=timeout)


def test_prime_rl_reverse_text_example_dry_runs_as_rlkube_reads_it(tmp_path, tiny_model):
    result = rlkube("rl", "@", EXAMPLE, "--model.name", tiny_model, "--output-dir", tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    orchestrator = tomllib.loads((tmp_path / "configs" / "orchestrator.toml").read_text())
    assert orchestrator["seq_len"] == 2048
    assert orchestrator["sampling"]["max_tokens"] == 128
    assert [(e["id"], e["name"]) for e in orchestrator["envs"]] == [("reverse_text", "reverse-text")]
    assert (orchestrator["batch_size"], orchestrator["group_size"]) == (128, 16)
    for alias, ours in [("seq_len", "orchestrator.seq_len"), ("orchestrator.train.env", "orchestrator.envs"),
                        ("orchestrator.train.sampling", "orchestrator.sampling"),
                        ("sampling.max_completion_tokens", "sampling.max_tokens")]:
        assert f"warning: '{alias}' is prime-rl's name: rlkube reads it as '{ours}'" in result.stderr
    assert "'orchestrator.batch_size' 128 counts rollouts, as prime-rl's code does: 8 tasks x group_size 16" \
        in result.stderr
    assert "(for 128 tasks, set batch_size = 2048)" in result.stderr


def test_upstream_example_is_refused_naming_each_unsupported_key(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text(UPSTREAM)
    result = rlkube("rl", "@", path, "--output-dir", tmp_path, "--dry-run")
    assert result.returncode == 2
    assert "orchestrator.envs.0.env: not supported: prime-rl's verifiers v1 env-server block" in result.stderr
    assert "orchestrator.renderer: not supported: rlkube renders prompts with the model's own chat template" \
        in result.stderr


def test_flags_take_prime_rl_names():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(RLConfig, [
            "--orchestrator.train.env", "[{id = 'tool_lookup'}]",
            "--orchestrator.train.sampling.max-completion-tokens", "64",
            "--orchestrator.rollouts-per-example", "4", "--orchestrator.batch-size", "8",
            "--orchestrator.eval.env", "[{id = 'tool_lookup'}]", "--orchestrator.eval.group-size", "3",
            "--orchestrator.training-mode", "rl", "--log.level", "debug", "--wandb", "--clean-output-dir",
        ])
    orchestrator = config.orchestrator
    assert [env.id for env in orchestrator.envs] == ["tool_lookup"]
    assert (orchestrator.sampling.max_tokens, orchestrator.group_size, orchestrator.batch_size) == (64, 4, 8)
    assert [env.args for env in orchestrator.eval.envs] == [{"split": "test"}]  # prime-rl's eval env: held out
    assert orchestrator.eval.rollouts_per_example == 3
    assert (config.log.level, config.wandb is not None, config.clean_output_dir) == ("debug", True, True)
    named = {str(w.message).split("'")[1] for w in caught if w.category is RenamedKeyWarning}
    assert {"orchestrator.train.env", "orchestrator.rollouts_per_example", "orchestrator.eval.env",
            "orchestrator.eval.group_size", "sampling.max_completion_tokens", "orchestrator.batch_size"} <= named


def test_kebab_case_toml_keys_under_prime_rl_tables(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text("[orchestrator.train.sampling]\nmax-completion-tokens = 32\n")
    assert load_config(RLConfig, ["@", str(path)]).orchestrator.sampling.max_tokens == 32


def test_a_flag_in_rlkube_names_merges_into_a_prime_rl_table(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text("[orchestrator.train.sampling]\nmax_completion_tokens = 32\n")
    sampling = load_config(RLConfig, ["@", str(path), "--orchestrator.sampling.temperature", "0.5"]).orchestrator.sampling
    assert (sampling.max_tokens, sampling.temperature) == (32, 0.5)
    with pytest.raises(ConfigError, match="'max_completion_tokens' and 'max_tokens' are one setting, given two values"):
        load_config(RLConfig, ["@", str(path), "--orchestrator.sampling.max-tokens", "64"])


@pytest.mark.parametrize("mode, reason", [
    ("opd", "set trainer.loss.type = 'opd' and a [teacher]"),
    ("sft", "run `rlkube eval --save-samples` against the teacher, then `rlkube sft`"),
])
def test_training_modes_rlkube_sets_elsewhere_are_refused_with_where(mode, reason):
    with pytest.raises(ConfigError, match="orchestrator: training_mode") as error:
        load_config(RLConfig, ["--orchestrator.training-mode", mode])
    assert reason in str(error.value)


def test_rlrun_spec_config_takes_prime_rl_names():
    run = example("rlrun.yaml")
    run["spec"]["config"]["orchestrator"] = {
        "batch_size": 16, "rollouts_per_example": 4, "seq_len": 256,
        "train": {"env": [{"id": "reverse_text"}], "sampling": {"max_completion_tokens": 40}},
        "eval": {"env": [{"id": "reverse_text"}], "group_size": 2},
    }
    assert schema_errors("RLRun", run) == []  # the API server keeps the keys (it would prune unknown ones)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedKeyWarning)
        orchestrator = RLRunSpec.model_validate(run["spec"]).config.orchestrator
    assert (orchestrator.group_size, orchestrator.sampling.max_tokens, orchestrator.eval.rollouts_per_example) == (4, 40, 2)
    run["spec"]["config"]["orchestrator"]["train"]["max_retries"] = 3
    assert any("orchestrator.train: Additional properties are not allowed ('max_retries'" in e
               for e in schema_errors("RLRun", run))
