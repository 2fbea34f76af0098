"""Fixtures: the kmock API server, a fake orchestrator /status endpoint, the operator running
embedded (kopf.operator in this event loop) against them."""

import pytest

from tests.operator.cluster import ApiServer
from tests.operator.embedded import running_operator, serve_status


@pytest.fixture
def kmock_options():
    return {"cls": ApiServer}


@pytest.fixture
async def orchestrator_status():
    async with serve_status() as status:
        yield status


@pytest.fixture
def operator_settings() -> dict:
    """Extra `Settings` of the operator under test; a test parametrizes it to change them."""
    return {}


@pytest.fixture
def registry_options() -> dict:
    """The operator's pacing: a fast resync and every progress change written, so tests see
    the status follow quickly; a test parametrizes it to test the pacing itself."""
    return {"interval": 0.3, "progress_interval": 0.0}


@pytest.fixture
async def cluster(kmock, orchestrator_status, operator_settings, registry_options):
    """The operator running against kmock; yields the test's handle on the cluster."""
    async with running_operator(kmock, orchestrator_status.url, settings=operator_settings,
                                **registry_options) as cluster:
        yield cluster
