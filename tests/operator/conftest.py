"""Fixtures: the local cluster's API server (through kmock's pytest fixture), a fake
orchestrator /status endpoint, the operator running embedded (kopf.operator in this event
loop) against them."""

import pytest

from e2e.localcluster import admission
from tests.operator.cluster import ApiServer
from tests.operator.embedded import running_operator, serve_status


@pytest.fixture
def kmock_options():
    return {"cls": ApiServer}


@pytest.fixture
def crd_rules_off(monkeypatch):
    """An API server that does not evaluate the CRDs' CEL rules (a CRD applied without them, or
    a cluster that cannot): what the operator checks again itself, and what a test of those
    checks needs, since the local cluster's API server refuses such specs first."""
    monkeypatch.setattr(admission, "check", lambda schema, obj, old=None: [])


@pytest.fixture
async def orchestrator_status():
    async with serve_status() as status:
        yield status


@pytest.fixture
def operator_settings() -> dict:
    """Extra `Settings` of the operator under test; a test parametrizes it to change them. Its
    guardrails, unless a test sets them: `embedded.PERMISSIVE`."""
    return {}


@pytest.fixture
def registry_options() -> dict:
    """The operator's pacing: a fast resync and every progress change written, so tests see
    the status follow quickly; a test parametrizes it to test the pacing itself."""
    return {"interval": 0.3, "progress_interval": 0.0}


@pytest.fixture
async def cluster(kmock, orchestrator_status, operator_settings, registry_options):
    """The operator running against the API server; yields the test's handle on the cluster."""
    async with running_operator(kmock, orchestrator_status.url, settings=operator_settings,
                                **registry_options) as cluster:
        yield cluster
