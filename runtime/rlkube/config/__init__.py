"""rlkube's configuration: pydantic models and the CLI that loads them.

Imports no torch, transformers or vLLM: the operator image imports this package.
"""

from rlkube.config.base import Config
from rlkube.config.cli import ConfigError, load_config, parse_cli, to_toml, write_toml
from rlkube.config.eval import EvalRunConfig
from rlkube.config.inference import InferenceConfig, InferenceSection, InferenceServerConfig
from rlkube.config.orchestrator import (
    AdvantageConfig,
    ClientConfig,
    DifficultyConfig,
    EnvConfig,
    EvalConfig,
    JudgeConfig,
    OrchestratorSection,
    PoolMemberConfig,
    RolloutServerConfig,
    SamplingConfig,
    TeacherConfig,
)
from rlkube.config.rl import OrchestratorConfig, RLConfig, RLTrainerSection, TrainerConfig
from rlkube.config.sft import SFTConfig, SFTDataConfig
from rlkube.config.shared import CheckpointConfig, LogConfig, ModelConfig, RunConfig, WandbConfig
from rlkube.config.trainer import (
    LoraConfig,
    LossConfig,
    OptimizerConfig,
    ParallelConfig,
    SchedulerConfig,
    TrainerCommonConfig,
)
from rlkube.config.weights import WeightTransferConfig

__all__ = [
    "AdvantageConfig",
    "CheckpointConfig",
    "ClientConfig",
    "Config",
    "ConfigError",
    "DifficultyConfig",
    "EnvConfig",
    "EvalConfig",
    "EvalRunConfig",
    "InferenceConfig",
    "InferenceSection",
    "InferenceServerConfig",
    "JudgeConfig",
    "LogConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "OrchestratorConfig",
    "OrchestratorSection",
    "ParallelConfig",
    "PoolMemberConfig",
    "RLConfig",
    "RLTrainerSection",
    "RolloutServerConfig",
    "RunConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SamplingConfig",
    "SchedulerConfig",
    "TeacherConfig",
    "TrainerCommonConfig",
    "TrainerConfig",
    "WandbConfig",
    "WeightTransferConfig",
    "load_config",
    "parse_cli",
    "to_toml",
    "write_toml",
]
