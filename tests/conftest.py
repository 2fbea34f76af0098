"""Shared fixtures. Each fixture module under tests/fixtures/ is imported here."""
from tests.fixtures.models import tiny_model  # noqa: F401
