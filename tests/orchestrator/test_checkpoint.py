"""The orchestrator's checkpoint part, on a local directory and on S3 (moto): marked complete
last, resolvable, and `latest` with nothing complete is a fresh start, not a crash loop."""

import fsspec
import pytest
from rlkube.checkpoints import MARKER, finish_part, is_complete, part_dir
from rlkube.config import OrchestratorConfig
from rlkube.orchestrator import checkpoint
from rlkube.orchestrator.app import resume_step_of

from tests.fixtures.storage import ckpt_root  # noqa: F401


def test_save_load_and_overwrite(ckpt_root):  # noqa: F811
    checkpoint.save(ckpt_root, 4, {"policy_step": 4, "x": [1]})
    path = checkpoint.save(ckpt_root, 4, {"policy_step": 4, "x": [2]})
    assert checkpoint.load(ckpt_root, 4) == {"policy_step": 4, "x": [2]}
    fs, stripped = fsspec.core.url_to_fs(path)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(stripped, detail=False)) == [MARKER, "state.json"]


def test_half_written_checkpoints_are_not_resumable(ckpt_root):  # noqa: F811
    fs, path = fsspec.core.url_to_fs(part_dir(ckpt_root, 6, "orchestrator"))
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/state.json", b"{}")  # killed before COMPLETE
    with pytest.raises(ValueError, match="ckpt.resume_step: .*orchestrator/step_6 is not a complete checkpoint"):
        checkpoint.resolve_step(ckpt_root, 6)
    checkpoint.save(ckpt_root, 2, {})
    assert checkpoint.resolve_step(ckpt_root, "latest") is None, "the trainer's part of step 2 is missing"
    finish_part(ckpt_root, 2, "trainer", {})
    assert checkpoint.resolve_step(ckpt_root, "latest") == 2
    assert checkpoint.resolve_step(ckpt_root, 2) == 2


def test_latest_with_nothing_complete_starts_fresh_and_abandons_stale_parts(ckpt_root, tmp_path):  # noqa: F811
    config = OrchestratorConfig(output_dir=tmp_path, ckpt={"url": ckpt_root, "resume_step": "latest"})
    assert resume_step_of(config) is None
    # A first attempt wrote its orchestrator part of step 2, the trainer died mid-save: start over,
    # and the stale half must not pair with the trainer part the new attempt writes for step 2.
    checkpoint.save(ckpt_root, 2, {"policy_step": 2})
    assert resume_step_of(config) is None
    assert not is_complete(ckpt_root, 2, "orchestrator")
    with pytest.raises(ValueError, match="ckpt.resume_step"):
        resume_step_of(config.model_copy(update={"ckpt": config.ckpt.model_copy(update={"resume_step": 2})}))
