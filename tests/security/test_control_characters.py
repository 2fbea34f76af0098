"""A tenant's pod writes what the operator copies into the run's status and Events: its
termination message (the runtime's error, or the log tail `FallbackToLogsOnError` makes one
of), waiting and scheduling messages. Terminal escapes and control characters in it would reach
the terminal of whoever runs `kubectl describe` or `kubectl get events`: clear the screen, forge
a line with a carriage return, hide text behind a bidirectional override. They are stripped
(`rlkube_operator.conditions.printable`); the text around them is kept."""

import re

from rlkube_operator.conditions import Conditions, printable

from tests.operator.test_operator_kmock import condition, pod_exited_2, rlrun, start_everything

HOSTILE = ("rlkube trainer: error: invalid config:\x1b[2J\x1b[H\x1b[32m model.name: '/data/nope' does not exist"
           "\x1b[0m\r\x00\x07 Succeeded \x1b]8;;http://evil.example/\x07details\x1b]8;;\x07 \u202edlrow\x9b2J")
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_printable_drops_escapes_and_controls_and_keeps_the_text():
    text = printable(HOSTILE)
    assert not CONTROLS.search(text), repr(text)
    assert "[2J" not in text and "8;;" not in text, "an escape sequence left half"
    assert text.startswith("rlkube trainer: error: invalid config: model.name: '/data/nope' does not exist")
    assert "Succeeded" in text and "details" in text and "dlrow" in text
    assert printable("pod a-1: back-off (4 container restarts)") == "pod a-1: back-off (4 container restarts)"


def test_a_condition_keeps_no_control_character_and_sees_no_change_in_the_same_message():
    conditions = Conditions([], generation=1, now="t1")
    assert conditions.set("Ready", False, "Crash\x1bLoop", HOSTILE)
    (ready,) = conditions.items
    assert not CONTROLS.search(ready["message"] + ready["reason"]), ready
    assert not conditions.set("Ready", False, "Crash\x1bLoop", HOSTILE), "the same message counted as a change"


async def test_a_termination_message_reaches_status_and_events_printable(cluster):
    """The trainer exits 2 with the hostile message: the run Fails with it, and its status
    message, `Failed` condition and Warning event carry it without a control character."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_exited_2(HOSTILE)})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"), what="Failed")
    event = await cluster.until(lambda: next((e for e in cluster.events() if e["reason"] == "Failed"), None))
    for where, text in (("status", status["message"]), ("Failed condition", condition(status, "Failed")["message"]),
                        ("event", event["message"])):
        assert "model.name: '/data/nope' does not exist" in text, (where, text)
        assert not CONTROLS.search(text), (where, text)
