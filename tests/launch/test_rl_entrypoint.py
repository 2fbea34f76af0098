"""`rlkube rl --dry-run` and resume-step resolution (no processes started)."""

import socket
import tomllib

from rlkube.config import RLConfig
from rlkube.entrypoints.rl import main
from rlkube.launch.checkpoints import MARKER, latest_run_checkpoint, part_dir
from rlkube.launch.local import child_stages, resolve_resume_step, write_process_configs

from tests.fixtures.inference import free_port


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
    assert "torch.distributed.run" in first[2].argv and "--nproc-per-node=2" in first[2].argv
    assert [s.name for s in second] == ["orchestrator"]
    assert first[2].log_path == tmp_path / "logs" / "trainer.log"


def complete(root, step, process):
    part_dir(root, step, process).mkdir(parents=True, exist_ok=True)
    (part_dir(root, step, process) / MARKER).touch()


def test_latest_needs_both_trainer_and_orchestrator_parts_complete(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        complete(root, step, "trainer")
        complete(root, step, "orchestrator")
    complete(root, 6, "trainer")  # killed before the orchestrator finished its part
    part_dir(root, 8, "orchestrator").mkdir(parents=True)  # half-written: no marker
    assert latest_run_checkpoint(root) == 4
    config = resolve_resume_step(RLConfig(output_dir=tmp_path, ckpt={"resume_step": "latest"}))
    assert config.ckpt.resume_step == 4


def test_latest_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    # A free port: the default 8000 may be taken on a shared machine, and that is refused first.
    argv = ["--output-dir", str(tmp_path), "--inference.port", str(free_port()), "--ckpt.resume-step", "latest"]
    assert main(argv) == 2
    assert "ckpt.resume_step" in capsys.readouterr().err


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
