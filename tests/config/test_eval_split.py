"""`rlkube eval` and the orchestrator's eval score the held-out split unless told otherwise:
an `--env.*` flag merges into the default `args.split = "test"` instead of replacing it."""

import subprocess
import sys
import tomllib

import pytest
from rlkube.config import RLConfig, load_config


def eval_dry_run(tmp_path, model, *flags) -> dict:
    """The env section of the config `rlkube eval ... --dry-run` writes for the run."""
    out = tmp_path / "eval"
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.entrypoints.main", "eval", "--model.name", str(model),
         "--output-dir", str(out), *flags, "--dry-run"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tomllib.loads((out / "configs" / "eval.toml").read_text())["env"]


@pytest.mark.parametrize(
    "flags, args",
    [
        ([], {"split": "test"}),
        (["--env.id", "tool_lookup"], {"split": "test"}),
        (["--env.args.num_examples", "5"], {"split": "test", "num_examples": 5}),
        (["--env.args", "{num_examples = 5}"], {"split": "test", "num_examples": 5}),
        (["--env.args.split", "train"], {"split": "train"}),
    ],
)
def test_eval_scores_the_held_out_split_unless_flags_name_one(tmp_path, tiny_model, flags, args):
    env = eval_dry_run(tmp_path, tiny_model, *flags)
    assert env["args"] == args


def test_orchestrator_eval_envs_score_their_held_out_split(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text(
        "[orchestrator.eval]\n"
        "[[orchestrator.eval.envs]]\nid = 'reverse_text'\n"
        "[[orchestrator.eval.envs]]\nid = 'tool_lookup'\nargs = {split = 'train', num_examples = 4}\n"
    )
    config = load_config(RLConfig, ["@", str(path)])
    assert [env.args for env in config.orchestrator.eval.envs] == [
        {"split": "test"}, {"split": "train", "num_examples": 4}]
