"""How the suite is ordered, and spread over pytest-xdist workers when asked
(`make test TEST_WORKERS=2` runs `-n 2 --dist loadgroup`; `make test` runs one process, in the
files' own order).

Each test file is one unit of work, so a module's fixtures are made once, except for what
several files share:

- "cluster": every scenario (e2e/scenarios), on the one local cluster a worker makes (torn
  down after the last scenario); the longest unit, so it is handed out first;
- "vllm": every test of the session's vLLM engines (`inference_server`, `moe_inference_server`),
  so each engine starts once.

Two workers on two cores: the scenarios' engine restarts compete with the other worker, and in
the run that tried it a recovery passed the scenarios' 180 s bound, so CI runs one process.
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
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") == "no":
        return  # one process: the files' own order (the scenarios last)
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
