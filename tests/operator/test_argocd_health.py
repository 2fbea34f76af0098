"""The Argo CD health check (docs/argocd-health-rlrun.lua), run by a real Lua interpreter."""

from pathlib import Path

import pytest

from tests.fixtures import prerequisites

lupa = prerequisites.import_module("lupa", "a Lua runtime, from the dev extra")

SCRIPT = (Path(__file__).resolve().parents[2] / "docs" / "argocd-health-rlrun.lua").read_text()


def health(status: dict | None, generation: int = 1) -> tuple[str, str]:
    lua = lupa.LuaRuntime()
    obj = {"metadata": {"name": "rt", "generation": generation}}
    if status is not None:
        obj["status"] = status
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return result["status"], result["message"]


def status(phase: str, ready: str = "True", reason: str = "Running", gen: int = 1, **extra) -> dict:
    conditions = [
        {"type": "Progressing", "status": "True", "reason": phase},
        {"type": "Ready", "status": ready, "reason": reason},
        *extra.pop("conditions", []),
    ]
    return {"phase": phase, "message": f"{phase} message", "observedGeneration": gen,
            "conditions": conditions, **extra}


@pytest.mark.parametrize(
    ("st", "expected"),
    [
        (None, "Progressing"),
        (status("Running"), "Healthy"),
        (status("Succeeded"), "Healthy"),
        (status("Suspended", "False", "Suspended"), "Suspended"),
        (status("Failed", "False", "Failed"), "Degraded"),
        (status("Initializing", "False", "Starting"), "Progressing"),
        (status("Initializing", "False", "CrashLoopBackOff"), "Degraded"),
        (status("Pending", "False", "ImagePullBackOff"), "Degraded"),
        (status("Running", gen=0), "Progressing"),  # status older than the spec
    ],
)
def test_health_follows_phase_and_conditions(st, expected):
    assert health(st)[0] == expected


def test_a_refused_spec_change_is_degraded_with_its_message():
    refused = {"type": "SpecAccepted", "status": "False", "reason": "ChangeRequiresRecreate",
               "message": "changes to spec.trainer.nodes cannot apply"}
    assert health(status("Running", conditions=[refused])) == ("Degraded", refused["message"])


def test_a_running_run_that_degrades_is_degraded_or_progressing_naming_the_component():
    crash = {"type": "Degraded", "status": "True", "reason": "CrashLoopBackOff",
             "message": "inference: pod rt-inference-0: back-off 40s"}
    assert health(status("Running", "False", "CrashLoopBackOff", conditions=[crash])) == ("Degraded", crash["message"])
    unready = crash | {"reason": "Starting", "message": "inference: 0/1 pods ready"}
    assert health(status("Running", "False", "Starting", conditions=[unready])) == ("Progressing", unready["message"])
    healthy = {"type": "Degraded", "status": "False", "reason": "Running", "message": ""}
    assert health(status("Running", conditions=[healthy]))[0] == "Healthy"
