"""helm/rlkube/README.md's values table is generated from values.yaml's `# --` comments
(scripts/chart_readme.py, checked by `make lint`): it is fresh, it covers every value with its
default, and a changed comment or an undocumented key is caught."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.operator.test_helm import CHART, REPO

spec = importlib.util.spec_from_file_location("chart_readme", REPO / "scripts" / "chart_readme.py")
chart_readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chart_readme)


def rows(readme: str) -> dict[str, tuple[str, object, str]]:
    """Key -> (type, default, description) of the README's values table."""
    out = {}
    for line in readme.splitlines():
        if line.startswith("| `"):
            key, kind, default, doc = (cell.strip() for cell in line.strip("| ").split(" | ", 3))
            out[key.strip("`")] = (kind, json.loads(default.strip("`")), doc)
    return out


def leaves(values: dict, prefix: str = "") -> list[str]:
    return [p for k, v in values.items() for p in (leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v
                                                    else [f"{prefix}{k}"])]


def test_the_committed_readme_is_fresh():
    assert chart_readme.main(["--check"]) == 0, "run `python scripts/chart_readme.py`"


def test_the_table_gives_every_value_its_default_and_doc():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = rows((CHART / "README.md").read_text())
    for leaf in leaves(values):
        assert any(leaf == key or leaf.startswith(key + ".") for key in table), leaf
    for key, (_, default, doc) in table.items():
        assert default == chart_readme.value_at(values, key) and doc, key
    assert table["image.registry"][0] == "string" and table["watch.allNamespaces"][1] is False
    assert table["resources"][1] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


@pytest.fixture
def chart(tmp_path) -> Path:
    shutil.copytree(CHART, tmp_path / "rlkube")
    return tmp_path / "rlkube"


def test_a_changed_comment_makes_the_check_fail_until_regenerated(chart, capsys):
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("# -- Image pull policy.", "# -- When the kubelet pulls the image."))
    assert chart_readme.main(["--check"], chart=chart) == 1
    assert "README.md is stale" in capsys.readouterr().err
    assert chart_readme.main([], chart=chart) == 0
    assert chart_readme.main(["--check"], chart=chart) == 0
    assert rows((chart / "README.md").read_text())["image.pullPolicy"][2] == "When the kubelet pulls the image."


def test_an_undocumented_value_is_refused_naming_it(chart):
    values = chart / "values.yaml"
    values.write_text(values.read_text() + "\nnewKnob:\n  depth: 3\n")
    with pytest.raises(SystemExit, match=r"no `# --` comment on newKnob, newKnob.depth"):
        chart_readme.main(["--check"], chart=chart)
