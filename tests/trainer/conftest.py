import pytest
from rlkube.trainer.dist import close_distributed

from tests.fixtures.inference import free_port


@pytest.fixture
def world_of_one(monkeypatch):
    """This test process as rank 0 of 1; the process group is gone afterwards."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield
    close_distributed()
