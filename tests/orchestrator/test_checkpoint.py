"""The orchestrator's checkpoint part: atomic, marked complete last, resolvable."""

import pytest
from rlkube.launch.checkpoints import part_dir
from rlkube.orchestrator import checkpoint


def test_save_load_and_overwrite(tmp_path):
    checkpoint.save(tmp_path, 4, {"policy_step": 4, "x": [1]})
    path = checkpoint.save(tmp_path, 4, {"policy_step": 4, "x": [2]})
    assert checkpoint.load(tmp_path, 4) == {"policy_step": 4, "x": [2]}
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "state.json"]
    assert not path.with_name("orchestrator.tmp").exists()


def test_half_written_checkpoints_are_not_resumable(tmp_path):
    part = part_dir(tmp_path, 6, "orchestrator")
    part.mkdir(parents=True)
    (part / "state.json").write_text("{}")  # killed before COMPLETE
    with pytest.raises(ValueError, match="step_6/orchestrator is not a complete checkpoint"):
        checkpoint.resolve_step(tmp_path, 6)
    checkpoint.save(tmp_path, 2, {})
    part_dir(tmp_path, 2, "trainer").mkdir()
    (part_dir(tmp_path, 2, "trainer") / "COMPLETE").touch()
    assert checkpoint.resolve_step(tmp_path, "latest") == 2
    assert checkpoint.resolve_step(tmp_path, 2) == 2
