"""Shared fixtures. Each fixture module under tests/fixtures/ is imported here."""
from tests.fixtures.inference import inference_server, moto_s3, s3_endpoint  # noqa: F401
from tests.fixtures.models import tiny_model  # noqa: F401
