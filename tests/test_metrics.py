"""The metrics sink: JSONL records, console line, W&B offline without a network."""

import json

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
