"""On-policy distillation settings: a loss that distills needs a teacher, and says so."""

import pytest
from rlkube.config import ConfigError, RLConfig, load_config

TEACHER = ["--orchestrator.teacher.model", "teacher-model"]


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--trainer.loss.type", "opd", "--trainer.loss.teacher-kl-coef", "1"], "trainer.loss.type 'opd'"),
        (["--trainer.loss.type", "grpo", "--trainer.loss.teacher-kl-coef", "0.5"], "trainer.loss.teacher_kl_coef 0.5"),
    ],
)
def test_distilling_without_a_teacher_names_both_fields(argv, named):
    with pytest.raises(ConfigError) as error:
        load_config(RLConfig, argv)
    assert named in str(error.value) and "neither teacher" in str(error.value)
    assert "nor orchestrator.teacher" in str(error.value)


def test_opd_needs_a_positive_teacher_weight():
    with pytest.raises(ConfigError, match=r"trainer\.loss: .*teacher_kl_coef must be > 0"):
        load_config(RLConfig, ["--trainer.loss.type", "opd", *TEACHER])


def test_a_teacher_needs_its_model_name():
    with pytest.raises(ConfigError, match=r"orchestrator\.teacher\.model: .*required"):
        load_config(RLConfig, ["--orchestrator.teacher.base-urls", '["http://t:8001"]'])


def test_distillation_reaches_the_trainer_and_the_orchestrator():
    config = load_config(RLConfig, ["--trainer.loss.type", "opd", "--trainer.loss.teacher-kl-coef", "1", *TEACHER])
    configs = config.process_configs(exclude_unset=True)
    teacher = configs["orchestrator"].teacher
    assert (teacher.model, teacher.base_urls, teacher.max_concurrent) == ("teacher-model", ["http://127.0.0.1:8001"], 64)
    assert configs["trainer"].loss.uses_teacher
    assert configs["orchestrator"].filter_zero_advantage and not configs["orchestrator"].drops_zero_advantage
    assert load_config(RLConfig, []).process_configs()["orchestrator"].drops_zero_advantage


SERVED = ["--teacher.model.name", "teacher-model", "--teacher.replicas", "2"]


def test_a_served_teacher_is_what_the_orchestrator_scores_with():
    """`[teacher]`: rlkube rl serves it (its own unpaused inference config, on its own ports) and
    the orchestrator's `teacher` points at those servers."""
    config = load_config(RLConfig, ["--trainer.loss.type", "opd", "--trainer.loss.teacher-kl-coef", "1", *SERVED,
                                    "--teacher.max-model-len", "512"])
    configs = config.process_configs(exclude_unset=True)
    teacher = configs["orchestrator"].teacher
    assert (teacher.model, teacher.base_urls) == ("teacher-model", ["http://127.0.0.1:8100", "http://127.0.0.1:8101"])
    served = configs["teacher"]
    assert (served.model.name, served.start_paused, served.max_model_len, served.port) == ("teacher-model", False, 512, 8100)
    assert configs["inference"].start_paused and configs["inference"].model.name != "teacher-model"


@pytest.mark.parametrize(
    "argv, error",
    [
        ([*SERVED, *TEACHER], "orchestrator.teacher: rlkube rl points the orchestrator at the [teacher] it serves"),
        ([*SERVED, "--teacher.port", "8001", "--inference.replicas", "2"],
         "teacher.port: port 8001 is also an inference replica's"),
    ],
)
def test_a_served_teacher_is_the_only_teacher_on_ports_of_its_own(argv, error):
    with pytest.raises(ConfigError) as raised:
        load_config(RLConfig, argv)
    assert error in str(raised.value)
