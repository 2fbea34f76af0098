"""The metrics sink: JSONL records, console line, W&B offline without a network."""

import json
import time

import pytest
from rlkube.config import WandbConfig
from rlkube.metrics import MetricsSink, format_metrics, read_metrics


def test_records_are_appended_as_json_lines(tmp_path):
    with MetricsSink(tmp_path, "sft", console=False) as sink:
        sink.log(1, {"loss": 2.5, "lr": 1e-3})
        sink.log(2, {"loss": 2.0, "lr": 1e-3})
    with MetricsSink(tmp_path, "sft", console=False) as sink:  # a resumed process appends
        sink.log(3, {"loss": 1.5})
    records = read_metrics(tmp_path, "sft")
    assert [(r["step"], r["loss"]) for r in records] == [(1, 2.5), (2, 2.0), (3, 1.5)]
    assert all("time" in r for r in records)


def test_a_disabled_sink_writes_nothing(tmp_path):
    with MetricsSink(tmp_path, "sft", enabled=False, wandb=WandbConfig()) as sink:
        sink.log(1, {"loss": 1.0})
    assert not (tmp_path / "metrics").exists()


def test_console_line_formats_small_and_large_numbers():
    line = format_metrics(7, {"loss": 1.23456, "lr": 1e-5, "tokens": 1200})
    assert line == "step 7 | loss 1.2346 | lr 1.00e-05 | tokens 1200"


def test_wandb_offline_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "")
    with MetricsSink(tmp_path, "sft", console=False, wandb=WandbConfig(project="t"), run_config={"a": 1}) as sink:
        sink.log(1, {"loss": 1.0})
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    assert json.loads((tmp_path / "metrics" / "sft.jsonl").read_text().splitlines()[0])["loss"] == 1.0


def wandb_history(run_file):
    """The history rows of an offline W&B run file: W&B's LevelDB-style log (a 7-byte header,
    then 32 KiB blocks of chunks `crc32 | length | type` holding protobuf `Record`s)."""
    import struct

    from wandb.proto.wandb_internal_pb2 import Record

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = Record.FromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def wait_for_history(run_file, rows: int, timeout_s: float = 60) -> list[dict]:
    """The run's history rows once `rows` of them are on disk: W&B's service process writes the
    file on its own schedule, and `finish()` can return before its last block is flushed."""
    deadline = time.monotonic() + timeout_s
    while True:
        history = [{k: v for k, v in row.items() if not k.startswith("_")} for row in wandb_history(run_file)]
        if len(history) >= rows or time.monotonic() > deadline:
            return history
        time.sleep(0.2)


def test_wandb_keeps_records_logged_out_of_step_order(tmp_path, monkeypatch):
    """The orchestrator logs batch n+1 before step n's policy update and eval (async_level 1):
    W&B must keep them all, each at its own step."""
    monkeypatch.setenv("WANDB_API_KEY", "")
    with MetricsSink(tmp_path, "orchestrator", console=False, wandb=WandbConfig(project="t")) as sink:
        sink.log(1, {"reward": 0.1})
        sink.log(2, {"reward": 0.2})
        sink.log(1, {"eval/avg@1": 0.5, "policy_step": 1.0})
        sink.log(3, {"reward": 0.3})
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/*.wandb")
    rows = wait_for_history(run_file, 4)
    assert rows == [
        {"reward": 0.1, "step": 1},
        {"reward": 0.2, "step": 2},
        {"eval/avg@1": 0.5, "policy_step": 1.0, "step": 1},
        {"reward": 0.3, "step": 3},
    ]


def test_rows_go_to_a_file_per_step_and_a_wandb_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "")
    rows = [{"reward": 1.0, "completion": "ab<|im_end|>"}, {"reward": 0.0, "completion": "ba"}]
    with MetricsSink(tmp_path, "orchestrator", console=False, wandb=WandbConfig(project="t")) as sink:
        path = sink.log_rows(4, "samples", rows)
    assert path == tmp_path / "samples" / "step_4.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/*.wandb")
    (row,) = wait_for_history(run_file, 1)
    assert row["step"] == 4 and row["samples/_type"] == "table-file" and row["samples/nrows"] == 2
    (table,) = run_file.parent.glob("files/media/table/samples_*.table.json")
    assert json.loads(table.read_text())["data"] == [[1.0, "ab<|im_end|>"], [0.0, "ba"]]


def test_prometheus_scrapes_the_newest_value_of_each_metric_over_http(tmp_path):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with MetricsSink(tmp_path, "trainer", console=False, prometheus=("127.0.0.1", 0)) as sink:
        url = f"http://127.0.0.1:{sink._prometheus_server.server_port}/metrics"
        sink.log(1, {"perf/tokens_per_s": 100.0, "perf/mfu": 0.25, "loss/mean": 0.5})
        sink.log(2, {"perf/tokens_per_s": 120.0, "perf/mfu": 0.3, "loss/mean": 0.4})
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    assert values["rlkube_trainer_perf_tokens_per_s"] == 120.0
    assert values["rlkube_trainer_perf_mfu"] == 0.3
    assert values["rlkube_trainer_step"] == 2


def test_histograms_are_one_prometheus_histogram_of_the_same_name_in_every_process(tmp_path):
    """A histogram logged step after step (`rlkube.histogram`) adds up into `rlkube_<name>`,
    labelled with the process; the console shows its summary, not its buckets."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    from rlkube.histogram import Histogram
    from rlkube.metrics import format_metrics

    samples = {}
    for process in ("orchestrator", "env-worker"):
        with MetricsSink(tmp_path / process, process, console=False, prometheus=("127.0.0.1", 0)) as sink:
            url = f"http://127.0.0.1:{sink._prometheus_server.server_port}/metrics"
            sink.log(1, Histogram("tool/latency_s", [0.03, 0.3, 3.0]).summary())
            sink.log(2, Histogram("tool/latency_s", [0.3, 30.0]).summary())
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        samples[process] = {(s.name, s.labels.get("le")): (s.value, s.labels["process"])
                            for family in text_string_to_metric_families(text) if family.name == "rlkube_tool_latency_s"
                            for s in family.samples}
    for process, values in samples.items():
        assert values[("rlkube_tool_latency_s_bucket", "0.05")] == (1.0, process)
        assert values[("rlkube_tool_latency_s_bucket", "0.5")] == (3.0, process)
        assert values[("rlkube_tool_latency_s_bucket", "+Inf")] == (5.0, process)
        assert values[("rlkube_tool_latency_s_count", None)] == (5.0, process)
        assert values[("rlkube_tool_latency_s_sum", None)][0] == pytest.approx(33.63)
    line = format_metrics(1, Histogram("tool/latency_s", [0.3]).summary())
    assert "tool/latency_s/p99" in line and "le_" not in line and "/count" not in line
