"""`rlkube rl --dry-run` and resume-step resolution (no processes started)."""

import socket
import tomllib
from pathlib import Path

import pytest
from rlkube.checkpoints import MARKER, checkpoint_root, part_dir, resolve_resume_step
from rlkube.config import InferenceConfig, OrchestratorConfig, RLConfig, TrainerConfig
from rlkube.entrypoints.rl import main
from rlkube.launch.local import child_stages, write_process_configs

from tests.fixtures.hub import hub_offline
from tests.fixtures.inference import free_port


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """These dry runs name hub models that are not in the offline architectures table: without
    this, each waits out the hub's timeout (~23 s) on a machine that cannot reach it."""
    hub_offline(monkeypatch)


def test_dry_run_writes_each_process_config(tmp_path):
    out = tmp_path / "run"
    code = main(["--output-dir", str(out), "--inference.replicas", "2", "--trainer.loss.kl-tau", "0.05",
                 "--max-steps", "7", "--dry-run"])
    assert code == 0
    trainer = tomllib.loads((out / "configs" / "trainer.toml").read_text())
    orchestrator = tomllib.loads((out / "configs" / "orchestrator.toml").read_text())
    inference = tomllib.loads((out / "configs" / "inference.toml").read_text())
    assert trainer["loss"]["kl_tau"] == 0.05 and trainer["max_steps"] == 7
    assert orchestrator["client"]["base_urls"] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert "replicas" not in inference
    assert not (out / "logs" / "trainer.log").exists(), "dry run must not start processes"


def test_stages_start_replicas_on_consecutive_ports_and_torchrun_for_several_ranks(tmp_path):
    config = RLConfig(output_dir=tmp_path, inference={"replicas": 2, "port": 9100}, trainer={"nproc_per_node": 2})
    stages = child_stages(config, write_process_configs(config))
    first, second = stages
    names = [s.name for s in first]
    assert names == ["inference-0", "inference-1", "trainer"]
    assert first[1].argv[-2:] == ["--port", "9101"] and first[1].health_url == "http://127.0.0.1:9101/health"
    assert "rlkube.entrypoints.torchrun" in first[2].argv and "--nproc-per-node=2" in first[2].argv
    assert [s.name for s in second] == ["orchestrator"]
    assert first[2].log_path == tmp_path / "logs" / "trainer.log"


def test_a_served_teacher_starts_with_inference_on_its_own_ports_before_the_orchestrator(tmp_path):
    config = RLConfig(output_dir=tmp_path, teacher={"model": {"name": "teacher"}, "replicas": 2, "port": 9200})
    paths = write_process_configs(config)
    first, second = child_stages(config, paths)
    assert [s.name for s in first] == ["inference-0", "teacher-0", "teacher-1", "trainer"]
    teacher = first[2]
    assert teacher.argv[-4:] == ["@", str(paths["teacher"]), "--port", "9201"]
    assert teacher.health_url == "http://127.0.0.1:9201/health" and teacher.log_path == tmp_path / "logs" / "teacher-1.log"
    served = InferenceConfig.model_validate(tomllib.loads(paths["teacher"].read_text()))
    assert (served.model.name, served.start_paused) == ("teacher", False)
    orchestrator = OrchestratorConfig.model_validate(tomllib.loads(paths["orchestrator"].read_text()))
    assert orchestrator.teacher.base_urls == ["http://127.0.0.1:9200", "http://127.0.0.1:9201"]
    assert [s.name for s in second] == ["orchestrator"]


def test_a_served_judge_starts_beside_the_teacher_and_the_orchestrator_calls_it(tmp_path):
    config = RLConfig(output_dir=tmp_path, teacher={"model": {"name": "teacher"}},
                      judge={"model": {"name": "judge"}, "replicas": 2, "port": 9300, "max_model_len": 256,
                             "sampling": {"temperature": 0.0, "max_tokens": 3}})
    paths = write_process_configs(config)
    first, _ = child_stages(config, paths)
    assert [s.name for s in first] == ["inference-0", "teacher-0", "judge-0", "judge-1", "trainer"]
    assert first[3].argv[-4:] == ["@", str(paths["judge"]), "--port", "9301"]
    assert first[3].health_url == "http://127.0.0.1:9301/health"
    assert first[3].max_restarts > 0 and first[1].max_restarts == 0, "a judge that dies is started again"
    served = InferenceConfig.model_validate(tomllib.loads(paths["judge"].read_text()))
    assert (served.model.name, served.start_paused, served.max_model_len) == ("judge", False, 256)
    judge = OrchestratorConfig.model_validate(tomllib.loads(paths["orchestrator"].read_text())).judge
    assert judge.model == "judge" and judge.base_urls == ["http://127.0.0.1:9300", "http://127.0.0.1:9301"]
    assert judge.sampling == {"temperature": 0.0, "max_tokens": 3}
    assert judge.served_by_run, "the judge rlkube rl serves is sent the run's generate credential"


def test_a_taken_teacher_port_is_refused_before_anything_starts(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")  # the teacher's model directory
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        # inference on a free port too: the default 8000 may be another run's
        argv = ["--output-dir", str(tmp_path), "--teacher.model.name", str(tmp_path), "--teacher.port", str(port),
                "--inference.port", str(free_port())]
        assert main(argv) == 2
    assert f"teacher.port: 127.0.0.1:{port} is in use" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists(), "no child was started"


FREE_PORT_FLAGS = ("--inference.port", "--rollouts.port", "--orchestrator.http-port", "--weights.grpc-port",
                   "--weights.nccl-port")


@pytest.mark.parametrize(("field", "weights"), [
    ("inference.port", "storage"), ("rollouts.port", "storage"), ("orchestrator.http_port", "storage"),
    ("weights.grpc_port", "grpc"), ("weights.nccl_port", "nccl"),
])
def test_every_port_the_run_binds_is_checked_before_anything_starts(tmp_path, capsys, field, weights):
    """A real listening socket on one port of the run, every other port free: `rlkube rl` exits
    2 at once, naming the field and the flag that changes it, and starts nothing."""
    flag = "--" + field.replace("_", "-")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--output-dir", str(tmp_path), "--weights.type", weights]
        for other in FREE_PORT_FLAGS:
            argv += [other, str(port if other == flag else free_port())]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{field}: 127.0.0.1:{port} is in use" in err and f"set {flag} to a free port" in err, err
    assert not (tmp_path / "logs").exists() and not (tmp_path / "configs").exists(), "nothing was started"


def test_two_servers_of_the_run_on_one_port_are_refused(tmp_path, capsys):
    port = free_port()
    argv = ["--output-dir", str(tmp_path), "--inference.port", str(free_port()), "--rollouts.port", str(port),
            "--orchestrator.http-port", str(port)]
    assert main(argv) == 2
    assert f"orchestrator.http_port: port {port} is also rollouts.port's" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def complete(root, step, process):
    Path(part_dir(root, step, process)).mkdir(parents=True, exist_ok=True)
    (Path(part_dir(root, step, process)) / MARKER).touch()


def test_latest_is_passed_through_and_each_process_resolves_the_same_step(tmp_path):
    """The launcher no longer pins `latest` to a number: a process restarted on its own (a pod)
    must find the newest checkpoint of that moment, so each process resolves it itself."""
    code = main(["--output-dir", str(tmp_path), "--ckpt.resume-step", "latest", "--dry-run"])
    assert code == 0, "no checkpoint yet: `latest` starts fresh instead of failing"
    configs = {
        name: cls.model_validate(tomllib.loads((tmp_path / "configs" / f"{name}.toml").read_text()))
        for name, cls in (("trainer", TrainerConfig), ("orchestrator", OrchestratorConfig))
    }
    root = checkpoint_root(tmp_path, configs["trainer"].ckpt)
    for step in (2, 4):
        complete(root, step, "trainer")
        complete(root, step, "orchestrator")
    complete(root, 6, "trainer")  # killed before the orchestrator finished its part
    Path(part_dir(root, 8, "orchestrator")).mkdir(parents=True)  # half-written: no marker
    for name, config in configs.items():
        assert config.ckpt.resume_step == "latest"
        assert checkpoint_root(config.output_dir, config.ckpt) == root
        assert resolve_resume_step(root, config.ckpt.resume_step, name) == 4, name


def test_a_taken_inference_port_is_refused_before_anything_starts(tmp_path, capsys):
    """Another server's `/health` on our port would pass for our replica coming up."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "keep").write_text("an earlier run's output")
        assert main(["--output-dir", str(tmp_path), "--inference.port", str(port), "--clean-output-dir"]) == 2
    assert f"inference.port: 127.0.0.1:{port} is in use" in capsys.readouterr().err
    assert (tmp_path / "keep").exists(), "refused before cleaning the output directory"
    assert not (tmp_path / "logs").exists(), "no child was started"


def test_given_base_urls_attach_to_running_servers_instead_of_starting_them(tmp_path):
    config = RLConfig(output_dir=tmp_path, orchestrator={"client": {"base_urls": ["http://10.0.0.5:8000"]}})
    stages = child_stages(config, write_process_configs(config))
    assert [[s.name for s in stage] for stage in stages] == [["trainer"], ["orchestrator"]]


def test_env_workers_start_beside_the_orchestrator_on_its_config(tmp_path):
    config = RLConfig(output_dir=tmp_path, orchestrator={"env_workers": 2})
    paths = write_process_configs(config)
    _, second = child_stages(config, paths)
    assert [s.name for s in second] == ["orchestrator", "env-worker-0", "env-worker-1"]
    worker = second[2]
    assert worker.argv[-3:] == ["rlkube.entrypoints.env_worker", "@", str(paths["orchestrator"])]
    assert worker.log_path == tmp_path / "logs" / "env-worker-1.log" and not worker.must_finish
    assert worker.max_restarts > 0, "a dead env worker is started again, not the end of the run"
