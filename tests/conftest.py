"""Shared fixtures. Each fixture module under tests/fixtures/ is imported here."""
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator

import pytest
from rlkube.auth import TOKEN_ENV, new_token

from tests.fixtures.inference import inference_server, moe_inference_server, moto_s3, s3_endpoint  # noqa: F401
from tests.fixtures.models import tiny_model, tiny_moe_model  # noqa: F401
from tests.fixtures.network import short_keepalive  # noqa: F401

# One run token for the session, as every process of a run shares one: the servers tests start
# (vLLM, gRPC) require it, and clients send it through the code production uses.
os.environ.setdefault(TOKEN_ENV, new_token())


@contextlib.contextmanager
def restored_environment() -> Iterator[None]:
    """`os.environ` as it was before the block, whatever the block set."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def environment_of_this_test():
    """Code run in-process may set variables for its own process (the trainer's compile cache
    sets `TORCHINDUCTOR_CACHE_DIR` to the run's folder); they must not outlive the test, or a
    later test's processes (a cluster's pods) inherit a folder that is gone or not theirs.
    A fixture wider than a test that runs such code wraps it in `restored_environment`."""
    with restored_environment():
        yield


@pytest.fixture(autouse=True)
def renderers_lock_of_this_tests_loop():
    """`renderers.client` serializes its first `/v1/models` lookup per engine URL with ONE
    module-level `asyncio.Lock`, and a lock that was ever waited on belongs to that event loop.
    rlkube's processes run one loop each, but tests run a loop per `asyncio.run`: once one test
    has made rollouts wait on it, a later test's first lookup of a new engine fails with "is
    bound to a different event loop". Each test gets a fresh lock."""
    if (client := sys.modules.get("renderers.client")) is not None:
        client._max_prompt_len_lock = asyncio.Lock()
