"""The values table of helm/rlkube/README.md, generated from values.yaml's `# --` comments (the
helm-docs convention: a comment starting `# -- ` documents the key below it, its continuation
lines included), so the README cannot drift from the values the chart takes.

    python scripts/chart_readme.py            # rewrite the table between the README's markers
    python scripts/chart_readme.py --check    # exit 1 if the committed README is stale (make lint)

A key with no `# --` comment of its own is covered by its nearest documented parent (whose row
shows the whole block as its default), or is a section of documented keys; any other key is an
error, naming it.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "rlkube"
BEGIN, END = "<!-- values:begin (scripts/chart_readme.py) -->", "<!-- values:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")
DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")
MORE = re.compile(r"^ *#(?: (?P<text>.*))?$")


def documented_keys(text: str) -> tuple[dict[str, str], list[str]]:
    """(dotted key -> its doc, in file order; every dotted key of the file)."""
    docs, keys, stack, pending = {}, [], [], None
    for line in text.splitlines():
        if m := DOC.match(line):
            pending = [m["text"]]
        elif pending is not None and (m := MORE.match(line)):
            pending.append(m["text"] or "")
        elif m := KEY.match(line):
            indent = len(m["indent"])
            stack = [(i, k) for i, k in stack if i < indent] + [(indent, m["key"])]
            path = ".".join(k for _, k in stack)
            keys.append(path)
            if pending is not None:
                docs[path] = " ".join(part.strip() for part in pending if part.strip())
            pending = None
        else:
            pending = None  # a blank line or a plain comment ends a doc
    return docs, keys


def value_at(values: dict, path: str):
    for part in path.split("."):
        values = values[part]
    return values


def kind(value) -> str:
    return {bool: "bool", int: "int", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), "null")


def table(values_text: str) -> str:
    docs, keys = documented_keys(values_text)
    values = yaml.safe_load(values_text)
    undocumented = [k for k in keys if not any(k == d or k.startswith(d + ".") or d.startswith(k + ".") for d in docs)]
    if undocumented:
        raise SystemExit(f"values.yaml: no `# --` comment on {', '.join(undocumented)} (nor on a key above it)")
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for path, doc in docs.items():
        value = value_at(values, path)
        if isinstance(value, dict) and any(k.startswith(path + ".") for k in docs):
            continue  # a section: its keys have rows of their own
        default = json.dumps(value, separators=(", ", ": ")).replace("|", "\\|")
        rows.append(f"| `{path}` | {kind(value)} | `{default}` | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def render(readme: str, values_text: str) -> str:
    head, sep, rest = readme.partition(BEGIN)
    _, sep_end, tail = rest.partition(END)
    if not sep or not sep_end:
        raise SystemExit(f"README.md: no {BEGIN} ... {END} markers to put the values table between")
    return f"{head}{BEGIN}\n{table(values_text)}\n{END}{tail}"


def main(argv: list[str] | None = None, chart: Path = CHART) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed README is stale")
    args = parser.parse_args(argv)
    readme = chart / "README.md"
    fresh = render(readme.read_text(), (chart / "values.yaml").read_text())
    if args.check:
        if fresh != readme.read_text():
            print(f"{readme} is stale: run `python scripts/chart_readme.py`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
