"""`rlkube pool`'s config derivation: each `--run` as a member of the pool (its configs, ports,
directories, credentials), and the refusals of what does not fit, naming the field; no engine."""

import tomllib

import pytest
from rlkube.config import ConfigError, load_config
from rlkube.config.pool import PoolConfig
from rlkube.entrypoints.pool import main
from rlkube.launch.pool import child_stages, members, split_runs, write_configs
from rlkube.scopes import ADMIN, GENERATE, ROLLOUTS, WORK, member_scoped, scope_env
from rlkube.withheld import TOKEN_ENV

from tests.fixtures.hub import hub_offline


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    hub_offline(monkeypatch)


@pytest.fixture
def files(tmp_path, tiny_model):
    """A pool.toml and a member's run.toml of the pool's shape (rank 8, the default targets)."""
    pool = tmp_path / "pool.toml"
    pool.write_text(f'output_dir = "{tmp_path}/pool"\n[model]\nname = "{tiny_model}"\n'
                    '[trainer]\ndevice = "cpu"\n[trainer.lora]\nrank = 8\n[pool]\nmax_runs = 3\nport = 50170\n'
                    '[inference]\nport = 8300\nmax_model_len = 512\n')
    run = tmp_path / "run.toml"
    run.write_text('max_steps = 4\n[trainer]\ndevice = "cpu"\n[trainer.lora]\nrank = 8\nalpha = 4\n'
                   '[orchestrator]\nseq_len = 256\n[[orchestrator.envs]]\nid = "reverse_text"\n')
    return {"pool": str(pool), "run": str(run)}


def derive(files, *runs: list[str]):
    pool_argv, run_args = split_runs(["@", files["pool"], *[a for run in runs for a in ["--run", *run]]])
    pool = load_config(PoolConfig, pool_argv)
    return pool, members(pool, run_args)


def test_each_run_is_a_member_with_its_own_dir_ports_and_adapter(files, tmp_path):
    pool, (a, b) = derive(files, ["a", "@", files["run"]], ["b", "@", files["run"], "--trainer.optim.lr", "3e-4"])
    assert [a.name, b.name] == ["a", "b"]
    assert a.output_dir == tmp_path / "pool" / "members" / "a"
    assert (a.config.rollouts.port, b.config.rollouts.port) == (50051, 50052)
    assert (a.config.orchestrator.http_port, b.config.orchestrator.http_port) == (8080, 8081)
    assert b.trainer.optim.lr == 3e-4 and a.trainer.optim.lr != 3e-4
    assert b.trainer.model == pool.model and b.trainer.lora.alpha == 4
    orchestrator = b.orchestrator
    assert orchestrator.client.lora_adapter == "b"
    assert orchestrator.client.base_urls == ["http://127.0.0.1:8300"]
    assert orchestrator.pool.member == "b" and orchestrator.pool.trainer == "127.0.0.1:50170"
    paths = write_configs(pool, [a, b])
    assert orchestrator.pool.trainer_config == paths["b/trainer"] == b.output_dir / "configs" / "trainer.toml"
    assert tomllib.loads(paths["b/trainer"].read_text())["optim"]["lr"] == 3e-4
    inference = tomllib.loads(paths["inference"].read_text())
    assert (inference["max_lora_rank"], inference["max_loras"], inference["start_paused"]) == (8, 3, False)
    assert "inference" not in tomllib.loads(paths["pool"].read_text())


def test_a_member_is_named_by_its_last_config_file_unless_named(files, tmp_path):
    lr = tmp_path / "lr_1e-3.toml"
    lr.write_text("[trainer.optim]\nlr = 1e-3\n")
    _, (member,) = derive(files, ["@", files["run"], "@", str(lr)])
    assert member.name == "lr-1e-3" and member.trainer.optim.lr == 1e-3
    with pytest.raises(ConfigError, match="two runs are named run"):
        derive(files, ["@", files["run"]], ["@", files["run"]])


def test_children_carry_the_pools_token_or_the_members_credentials_alone(files, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "pool-token")
    pool, ms = derive(files, ["a", "@", files["run"], "--orchestrator.env-workers", "1"], ["b", "@", files["run"]])
    first, second = child_stages(pool, ms, write_configs(pool, ms))
    assert [c.name for c in first] == ["inference-0", "pool-trainer"]
    assert all(c.env[TOKEN_ENV] == "pool-token" and c.member is None for c in first)
    assert "rlkube.entrypoints.pool_trainer" in first[1].argv
    assert [c.name for c in second] == ["a/orchestrator", "a/env-worker-0", "b/orchestrator"]
    orchestrator = second[0]
    assert orchestrator.must_finish and orchestrator.member == "a" and TOKEN_ENV not in orchestrator.env
    assert orchestrator.env == {scope_env(s): member_scoped("pool-token", "a", s) for s in (GENERATE, ADMIN, ROLLOUTS, WORK)}
    assert second[1].env == {scope_env(s): member_scoped("pool-token", "a", s) for s in (GENERATE, WORK)}
    assert second[1].member == "a" and not second[1].must_finish


@pytest.mark.parametrize(("flags", "field"), [
    (["--trainer.lora.rank", "4"], "trainer.lora.rank: 4 is not the pool's 8"),
    (["--trainer.lora.target-modules", '["q_proj"]'], "trainer.lora.target_modules"),
    (["--trainer.lora.dropout", "0.1"], "trainer.lora.dropout"),
    (["--no-trainer.lora"], "trainer.lora: a pool member trains a LoRA adapter"),
    (["--trainer.lora.serving", "merge"], "trainer.lora.serving"),
    (["--trainer.device", "cuda"], "trainer.device"),
    (["--model.name", "Qwen/Qwen3-0.6B"], "model.name: 'Qwen/Qwen3-0.6B' is not the pool's"),
    (["--output-dir", "elsewhere"], "output_dir"),
    (["--clean-output-dir"], "clean_output_dir"),
    (["--weights.type", "grpc"], "weights.type"),
    (["--inference.max-model-len", "1024"], "inference.max_model_len: 1024 is not the pool's 512"),
    (["--orchestrator.client.base-urls", '["http://x:1"]'], "orchestrator.client.base_urls"),
    (["--rollouts.port", "8300"], "--run a: rollouts.port: port 8300 is also inference.port's"),
])
def test_what_the_pool_decides_is_refused_naming_the_run_and_field(files, flags, field):
    with pytest.raises(ConfigError) as refused:
        derive(files, ["a", "@", files["run"], *flags])
    assert str(refused.value).startswith("--run a: ") and field in str(refused.value)


def test_more_runs_than_the_pool_trains_are_refused(files):
    with pytest.raises(ConfigError, match="pool.max_runs: 4 runs"):
        derive(files, *[[name, "@", files["run"]] for name in "abcd"])


def test_dry_run_exits_2_naming_the_field_and_writes_configs_when_all_fit(files, tmp_path, capsys):
    assert main(["@", files["pool"], "--run", "a", "@", files["run"], "--trainer.lora.rank", "16", "--dry-run"]) == 2
    assert "--run a: trainer.lora.rank: 16 is not the pool's 8" in capsys.readouterr().err
    assert not (tmp_path / "pool" / "configs").exists()
    assert main(["@", files["pool"], "--run", "a", "@", files["run"], "--run", "b", "@", files["run"], "--dry-run"]) == 0
    assert (tmp_path / "pool" / "members" / "b" / "configs" / "orchestrator.toml").is_file()
    assert not (tmp_path / "pool" / "logs" / "pool-trainer.log").exists(), "a dry run starts nothing"
