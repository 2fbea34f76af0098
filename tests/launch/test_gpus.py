"""GPU placement of `rlkube rl`'s processes (no GPU needed: visible devices are given)."""

import pytest
from rlkube.config import InferenceConfig, RLConfig
from rlkube.entrypoints.rl import main
from rlkube.launch.gpus import place_gpus, trainer_share, visible_gpus
from rlkube.launch.local import child_stages, write_process_configs

from tests.fixtures.inference import vllm_args


def rl(**sections) -> RLConfig:
    return RLConfig.model_validate(sections)


def test_replicas_take_the_first_gpus_and_the_trainer_the_next():
    placed = place_gpus(rl(inference={"replicas": 2}, trainer={"nproc_per_node": 2}), ["0", "1", "2", "3"])
    assert placed.inference == [["0"], ["1"]] and placed.trainer == ["2", "3"]
    tensor_parallel = rl(inference={"tensor_parallel_size": 2}, trainer={"nproc_per_node": 2}, weights={"type": "nccl"})
    placed = place_gpus(tensor_parallel, ["4", "5", "6", "7"])  # CUDA_VISIBLE_DEVICES=4,5,6,7
    assert placed.inference == [["4", "5"]] and placed.trainer == ["6", "7"]


def test_a_served_teacher_takes_the_gpus_after_the_trainers():
    teacher = {"model": {"name": "teacher"}, "replicas": 2, "tensor_parallel_size": 2}
    placed = place_gpus(rl(trainer={"nproc_per_node": 2}, teacher=teacher), [str(i) for i in range(7)])
    assert placed.inference == [["0"]] and placed.trainer == ["1", "2"] and placed.served["teacher"] == [["3", "4"], ["5", "6"]]
    placed = place_gpus(rl(teacher=teacher | {"gpus": [1, 2, 1, 2]}), ["0", "1", "2"])
    assert placed.served["teacher"] == [["1", "2"], ["1", "2"]]
    with pytest.raises(ValueError, match=r"teacher.gpus: 1 GPUs given, 4 needed"):
        place_gpus(rl(teacher=teacher | {"gpus": [0]}), ["0", "1"])
    one = {"model": {"name": "teacher"}}
    with pytest.raises(ValueError, match=r"teacher.gpus: GPU 0 would serve both inference and the teacher.* claim 1.8"):
        place_gpus(rl(teacher=one), ["0"])
    shared = place_gpus(rl(inference={"gpu_memory_utilization": 0.45}, teacher=one | {"gpu_memory_utilization": 0.4}), ["0"])
    assert shared.inference == shared.served["teacher"] == [["0"]]


def test_one_gpu_is_shared_unless_weights_go_over_nccl():
    placed = place_gpus(rl(), ["0"])
    assert placed.inference == [["0"]] and placed.trainer == ["0"]
    with pytest.raises(ValueError, match=r"GPU 0 would hold both .* weights.type 'nccl'.*2 are needed apart"):
        place_gpus(rl(weights={"type": "nccl"}), ["0"])


def test_gpus_given_by_hand_are_checked():
    placed = place_gpus(rl(inference={"gpus": [3]}, trainer={"gpus": [0]}), ["0", "1", "2", "3"])
    assert placed.inference == [["3"]] and placed.trainer == ["0"]
    with pytest.raises(ValueError, match=r"inference.gpus: 1 GPUs given, 2 needed"):
        place_gpus(rl(inference={"gpus": [0], "replicas": 2}), ["0", "1"])
    with pytest.raises(ValueError, match=r"trainer.gpus: \[5\] are not among the 2 visible GPUs"):
        place_gpus(rl(trainer={"gpus": [5]}), ["0", "1"])
    with pytest.raises(ValueError, match="GPU 1 would hold both"):
        place_gpus(rl(inference={"gpus": [1]}, trainer={"gpus": [1]}, weights={"type": "nccl"}), ["0", "1"])


def test_visible_gpus_are_read_as_cuda_reads_them(monkeypatch):
    for value, expected in {"4,5": ["4", "5"], "": [], "-1": [], "0,-1,1": ["0"], "GPU-ab12, GPU-cd34": ["GPU-ab12", "GPU-cd34"]}.items():
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_gpus() == expected, value


def test_a_machine_without_gpus_places_nothing(tmp_path):
    assert place_gpus(rl(), []) is None
    config = rl(output_dir=str(tmp_path))
    first, _ = child_stages(config, write_process_configs(config))
    assert all("CUDA_VISIBLE_DEVICES" not in child.env for child in first)


def test_each_child_sees_its_own_gpus(tmp_path):
    config = rl(output_dir=str(tmp_path), inference={"replicas": 2}, trainer={"nproc_per_node": 2})
    first, _ = child_stages(config, write_process_configs(config), place_gpus(config, ["0", "1", "2", "3"]))
    assert {child.name: child.env.get("CUDA_VISIBLE_DEVICES") for child in first} == {
        "inference-0": "0", "inference-1": "1", "trainer": "2,3",
    }


def test_rl_refuses_an_nccl_overlap_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main(["--output-dir", str(tmp_path), "--weights.type", "nccl", "--dry-run"]) == 2
    assert "weights.type 'nccl' cannot form a group" in capsys.readouterr().err
    assert not (tmp_path / "configs").exists()


def test_tensor_parallel_size_reaches_vllm():
    """Read by vLLM's parser: a GPU engine cannot start here."""
    assert vllm_args(InferenceConfig(tensor_parallel_size=2), on_cpu=False).tensor_parallel_size == 2
    assert vllm_args(InferenceConfig(), on_cpu=False).tensor_parallel_size == 1


def test_the_trainer_shares_its_gpu_with_the_inference_replicas_placed_on_it():
    one_gpu = RLConfig.model_validate({"trainer": {"gpus": [0]}, "inference": {"gpus": [0], "gpu_memory_utilization": 0.35}})
    assert trainer_share(one_gpu) == pytest.approx(0.65)
    apart = RLConfig.model_validate({"trainer": {"nproc_per_node": 2}, "inference": {"replicas": 6}})
    assert trainer_share(apart) == 1.0
