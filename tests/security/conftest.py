"""The operator's test fixtures (tests/operator/conftest.py): the local cluster's API server,
the operator running embedded against it, a fake orchestrator /status."""

from tests.operator.conftest import (  # noqa: F401
    cluster,
    kmock_options,
    operator_settings,
    orchestrator_status,
    registry_options,
)
