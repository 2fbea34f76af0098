"""The SFT trainer's GET /status server on its own (the run end to end: test_sft_train.py)."""

import httpx
import pytest
from rlkube.trainer.sft.status import StatusServer


def test_serves_the_latest_update_and_nothing_else():
    server = StatusServer("127.0.0.1", 0, step=3, max_steps=10)
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{url}/status").json() == {"phase": "running", "step": 3, "max_steps": 10,
                                                     "loss": None, "last_checkpoint_step": None}
        server.update(step=4, loss=0.25, last_checkpoint_step=4)
        assert httpx.get(f"{url}/status").json() == {"phase": "running", "step": 4, "max_steps": 10,
                                                     "loss": 0.25, "last_checkpoint_step": 4}
        assert httpx.get(f"{url}/metrics").status_code == 404
    finally:
        server.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/status")


def test_a_taken_port_is_refused_naming_the_field():
    first = StatusServer("127.0.0.1", 0, step=0, max_steps=1)
    try:
        with pytest.raises(OSError, match=f"status_port: cannot serve on 127.0.0.1:{first.port}"):
            StatusServer("127.0.0.1", first.port, step=0, max_steps=1)
    finally:
        first.close()
