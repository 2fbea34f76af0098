"""The `[judge]` block of an RL config: refused where it would clash (ports, a second judge)."""

import pytest
from pydantic import ValidationError
from rlkube.config import RLConfig


@pytest.mark.parametrize(("settings", "message"), [
    ({"judge": {"model": {"name": "j"}, "port": 8000}}, "judge.port: port 8000 is also an inference replica's"),
    ({"judge": {"model": {"name": "j"}, "port": 8101}, "teacher": {"model": {"name": "t"}, "replicas": 2}},
     "judge.port: port 8101 is also a teacher replica's (teacher.port 8100, 2 replicas)"),
    ({"judge": {"model": {"name": "j"}}, "orchestrator": {"judge": {"model": "j"}}},
     "orchestrator.judge: rlkube rl points the orchestrator at the [judge] it serves"),
])
def test_a_judge_that_would_clash_is_refused_naming_the_field(settings, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RLConfig.model_validate(settings)


def test_a_judge_of_your_own_is_passed_through():
    config = RLConfig.model_validate({"orchestrator": {"judge": {"model": "j", "base_urls": ["http://judge:8000"]}}})
    orchestrator = config.process_configs()["orchestrator"]
    assert orchestrator.judge.base_urls == ["http://judge:8000"] and "judge" not in config.process_configs()
    assert not orchestrator.judge.served_by_run, "a judge of your own is never sent the run's credential"
