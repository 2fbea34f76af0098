import contextlib
from collections.abc import Iterator

import pytest
from rlkube.trainer.dist import close_distributed

from tests.fixtures.inference import free_port


@contextlib.contextmanager
def one_rank_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as rank 0 of 1 inside the block; the process group is gone afterwards."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        yield
    finally:
        close_distributed()


@pytest.fixture
def world_of_one(monkeypatch):
    """This test process as rank 0 of 1; the process group is gone afterwards."""
    with one_rank_world(monkeypatch):
        yield
