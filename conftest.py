"""How the suite is spread over pytest-xdist workers (`make test` runs `-n 2 --dist loadgroup`).

On two cores much of the suite waits rather than computes (engines and pods starting, keepalive
and retry deadlines), so two workers share the machine well. Each test file is one unit of work,
so a module's fixtures are made once, except for what several files share:

- "cluster": every scenario (e2e/scenarios), on the one local cluster a worker makes; the
  longest unit, so it is handed out first;
- "vllm": every test of the session's vLLM engines (`inference_server`, `moe_inference_server`),
  so each engine starts once.

Run without `-n`, the marks change nothing but the order: the two shared units come first.
"""

import pytest

SCENARIOS = "e2e/scenarios/"
VLLM_FIXTURES = ("inference_server", "moe_inference_server")
UNITS = ("cluster", "vllm")
"""The shared units, in the order they are handed out."""


def work_unit(item: pytest.Item) -> str:
    if item.nodeid.startswith(SCENARIOS):
        return "cluster"
    if any(name in item.fixturenames for name in VLLM_FIXTURES):
        return "vllm"
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks into the items' ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    items.sort(key=lambda item: UNITS.index(unit) if (unit := work_unit(item)) in UNITS else len(UNITS))



def pytest_collection_finish(session: pytest.Session) -> None:
    """pytest-xdist groups tests by appending the group to their ids; with a pytest that keeps ids
    where it does not look (9.2), every test would be its own unit, silently: a local cluster and
    the engines started once per worker. Fail instead."""
    if getattr(session.config.option, "loadgroup", False) and session.items and "@" not in session.items[0].nodeid:
        raise pytest.UsageError("pytest-xdist did not group the tests (--dist loadgroup): use the pytest "
                                "constraints.txt pins")


def pytest_terminal_summary(terminalreporter) -> None:
    """The figures tests record (`record_property`: recovery times, rewards), printed for every
    test that ran to its end: a worker's own output is not shown, and a passing run's figures
    are the ones a note quotes."""
    reports = [r for kind in ("passed", "failed") for r in terminalreporter.stats.get(kind, [])
               if r.when == "call" and r.user_properties]
    if reports:
        terminalreporter.section("figures")
        for report in reports:
            for name, value in report.user_properties:
                terminalreporter.write_line(f"{report.nodeid}: {name}: {value}")
