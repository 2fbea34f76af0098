"""An environment that starts a program, as a code environment runs what the policy wrote: the
reverse-text tasks and reward (`rlkube.envs.reverse_text`), and, when a process first builds
it, `prober.py` (beside this file) started as a child with `subprocess.Popen`, inheriting the
process's environment, files and stdout as any program an environment starts does. The prober
waits for `targets.json` beside it (the scenario adds it to the ConfigMap this directory is
mounted from) and prints what every port of the run gave it (`PORT-PROBE …` in the pod's log).

Installed in the scenario's env-worker and orchestrator pods from a ConfigMap, with
`PYTHONPATH` naming its mount: taskset id `rlkube_port_probe` (verifiers imports a taskset by
its top-level module)."""

import subprocess
import sys
from pathlib import Path

import verifiers.v1 as vf
from rlkube.envs import chat_harness, reverse_text

HERE = Path(__file__).resolve().parent
_started: list[subprocess.Popen] = []


def start_program() -> None:
    """The prober, once per process."""
    if not _started:
        _started.append(subprocess.Popen([sys.executable, str(HERE / "prober.py"), str(HERE / "targets.json")]))


class PortProbeTaskset(reverse_text.ReverseTextTaskset):
    """Reverse-text's tasks, config and reward."""


class PortProbeEnv(vf.SingleAgentEnv):
    """Played as reverse-text is, in-process by rlkube's chat harness; building it starts the
    program."""

    def __init__(self, config: vf.SingleAgentEnvConfig):
        start_program()
        agent = {"harness": {"id": chat_harness.HARNESS_ID}, "runtime": {"type": "subprocess"}}
        super().__init__(type(config).model_validate(config.model_dump() | {"agent": agent}))


__all__ = ["PortProbeEnv", "PortProbeTaskset"]
