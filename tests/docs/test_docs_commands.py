"""Every command shown in README.md and docs/ runs as written, or is mapped to what runs it.

The docs' fenced blocks are read as a user reads them: a `bash`/`sh` block is commands; a
`console` block's commands are its `$ ` lines; an untagged block's commands are its lines that
start with one of our programs. Each command is then, by the first rule that matches:

- mapped (`MAPPED`): a long run (`make reverse-text`, a cluster apply, a training run) that a
  named test or target runs; the test checks that the named test still exists;
- run with `--dry-run` (`rlkube rl|sft|eval|inference|...`): the config it names resolves and
  every path it reads exists, in a sandbox where the file's earlier commands ran before it;
- run as it is (`rlkube model init`, `--help`, a `python3 -c` one-liner);
- `rlkube-operator`: its arguments and key file checked as `main` checks them before it connects
  (the operator itself runs against a cluster in tests/operator).

A command that no rule takes fails the test, so a new doc block is either runnable or mapped.
A command whose comment says `# refused` must exit 2 (the docs show a refusal).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("rlkube", "rlkube-operator", "make", "kubectl", "helm", "torchrun", "python", "pytest",
            "e2e/", "bash", "git")
DRY_RUN = ("rl", "sft", "eval", "inference", "orchestrator", "trainer", "env-worker", "pool")

# Long commands and where they run. Each value names tests (file::function) or a Makefile target
# that executes the same thing; `test_mapped_targets_exist` keeps the names honest (each file,
# and each function in it). Cluster commands are mapped one by one: a new one is unmapped until
# it is given the test that does what it does.
MAPPED: dict[str, tuple[str, ...]] = {
    r"^make reverse-text\b": ("Makefile:reverse-text", "tests/integration/test_rl_reverse_text.py"),
    r"^make (test|test-fast|e2e-local|e2e-extended|lint|images|crds|proto)\b": ("Makefile:{1}",),
    r"^(?:[A-Z_]+=\S+ )*(?:python3? -m )?pytest (?:-\S+ )*(tests/\S+)": ("{1}",),  # the tests it names
    r"^python -m rlkube_operator\.crd\b": ("tests/operator/test_crds.py",),
    r"^e2e/run\.sh\b": ("tests/operator/test_e2e_kind.py",),
    # Helm: the chart rendered as `helm install` renders it, for each values set the docs show;
    # e2e/run.sh installs it with `helm upgrade --install` and waits for the operator's rollout.
    r"^helm install rlkube helm/rlkube -n rlkube\b": (
        "tests/operator/test_helm.py::test_rendered_objects_validate_on_every_claimed_minor",
        "tests/operator/test_e2e_kind.py::test_run_sh_creates_the_cluster_switches_context_then_installs_the_chart_and_runs_the_scenarios"),
    r"^helm upgrade rlkube helm/rlkube -n rlkube\b": (
        "tests/operator/test_e2e_kind.py::test_run_sh_creates_the_cluster_switches_context_then_installs_the_chart_and_runs_the_scenarios",),
    r"^helm uninstall rlkube\b": ("tests/operator/test_helm.py::test_crds_are_upgradable_templates_kept_on_uninstall",),
    r"^kubectl delete rlruns,sftruns --all\b": (
        "tests/operator/test_operator_kmock.py::test_a_recreated_run_adopts_nothing_from_its_predecessor",),
    r"^helm install rlkube-crds\b": ("tests/operator/test_helm.py::test_the_crd_chart_installs_exactly_the_committed_crds",),
    r"^helm install rlkube helm/rlkube -n team-[ab] --set crds\.install=false": (
        "tests/operator/test_helm.py::test_a_second_release_in_another_namespace_owns_nothing_the_first_owns",),
    r"^kubectl -n rlkube rollout status deploy/rlkube-rlkube-operator\b": (
        "tests/operator/test_e2e_kind.py::test_run_sh_creates_the_cluster_switches_context_then_installs_the_chart_and_runs_the_scenarios",),
    r"^kubectl get crd rlruns\.rlkube\.dev\b": ("tests/operator/test_helm.py::test_crds_are_upgradable_templates_kept_on_uninstall",),
    # kubectl: the scenario (or the operator against kmock's API emulator) doing what the command shows.
    r"^kubectl -n ml-team (apply -f examples/reverse_text/(sft|rl)run\.yaml|get (sft|rl)runs -w)$": (
        "e2e/scenarios/test_reverse_text.py::test_reverse_text_sft_then_rl_on_the_cluster",),
    r"^kubectl -n ml-team get configmap reverse-text-config\b": (
        "tests/operator/test_operator_kmock.py::test_rlrun_creates_every_child_with_the_right_spec",),
    r"^kubectl get rlruns( -o wide)?$": ("tests/operator/test_operator_kmock.py::test_status_and_printer_columns_follow_the_pods",
                                         "e2e/scenarios/test_reverse_text.py::test_reverse_text_sft_then_rl_on_the_cluster"),
    r"^kubectl (scale rlrun/reverse-text --replicas 2|get rlrun reverse-text)$": (
        "e2e/scenarios/test_scale.py::test_kubectl_scale_resizes_inference_mid_run_without_restarting_the_trainer",),
    r"^kubectl get rlrun big -o jsonpath='\{\.status\.message\}'$": (
        "tests/operator/test_operator_kmock.py::test_status_and_printer_columns_follow_the_pods",),
    r"^kubectl describe rlrun big$": ("tests/operator/test_operator_kmock.py::test_backoff_limit_exhausted_fails_the_run_with_the_reason",),
    r"^kubectl get rlrun doomed -o jsonpath=": (
        "e2e/scenarios/test_give_up.py::test_a_missing_model_fails_the_run_at_once_with_the_runtimes_error",),
    r"^kubectl get rlpools -A$": ("tests/operator/test_pools.py::test_rlpool_printer_columns",),
    # The key rotation (docs/security.md): the operator under a new key and the previous one.
    r"^kubectl -n rlkube (get secret rlkube-rlkube-operator-token-key|create secret generic rlkube-(previous-)?token-key"
    r"|delete secret rlkube-previous-token-key)\b": (
        "tests/security/test_fence.py::test_a_key_rotation_leaves_a_run_started_before_a_tightening_going_on",
        "tests/operator/test_helm.py::test_a_rotations_previous_key_is_mounted_for_the_operator_and_named_by_no_run"),
    r"^torchrun --nproc-per-node 2 -m rlkube\.entrypoints\.sft\b": ("tests/integration/test_sft_reverse_text.py",),
    r"^rlkube plot\b": ("tests/test_plot.py",),
    r"^bash examples/pool_reverse_text/run\.sh\b": ("tests/integration/test_pool.py",),
    r"^rlkube export\b": ("tests/trainer/test_export.py",),
}

# Outputs of long commands that a file's later commands read: made as tiny models before the
# file's commands run, standing in for what the mapped run writes.
PRODUCED = {
    "README.md": ("outputs/reverse_text/sft/weights/final",),
    "docs/multi-tenant.md": ("outputs/reverse_text/sft/weights/final",),
    "docs/training.md": ("outputs/reverse_text/sft/weights/final", "outputs/reverse_text/sft_long/weights/final",
                         "outputs/reverse_text/rl/export/step_140"),
}


def logical_lines(block: list[str]) -> list[tuple[int, str]]:
    """Joins backslash continuations; (offset of the first line, the line)."""
    out, start, parts = [], None, []
    for i, line in enumerate(block):
        start = i if start is None else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        out.append((start, " ".join(p.strip() for p in parts)))
        start, parts = None, []
    return out


def doc_commands(path: Path) -> list[tuple[int, str, str]]:
    """(line number, command, its trailing comment) for every command in the file's blocks."""
    found, block, tag, first = [], None, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block, tag, first = [], line[3:].strip(), number + 1
                continue
            for offset, text in logical_lines(block):
                command = command_of(text, tag)
                if command:
                    found.append((first + offset, *command))
            block = None
        elif block is not None:
            block.append(line)
    return found


def command_of(line: str, tag: str) -> tuple[str, str] | None:
    text = line.strip()
    if tag == "console":
        if not text.startswith("$ "):
            return None
        text = text[2:]
    elif tag not in ("bash", "sh", "shell") and not text.startswith(PROGRAMS):
        return None
    if not text or text.startswith("#"):
        return None
    command, _, comment = text.partition("  #")
    if tag in ("bash", "sh", "shell", "console") or "#" not in command:
        return command.strip(), comment.strip()
    return None


def mapping(command: str) -> tuple[str, ...] | None:
    for pattern, targets in MAPPED.items():
        if match := re.search(pattern, command):
            group = (match.group(1) if match.re.groups else "") or ""
            return tuple(t.replace("{1}", group) for t in targets)
    return None


ALL = [(path.relative_to(ROOT).as_posix(), n, c, comment)
       for path in DOCS for n, c, comment in doc_commands(path)]


def test_the_docs_show_commands():
    assert len(ALL) > 30, [c for _, _, c, _ in ALL]


@pytest.mark.slow  # each dry run imports torch and transformers: ~2 minutes in all
@pytest.mark.parametrize("doc", sorted({doc for doc, *_ in ALL}))
def test_every_command_runs_or_is_mapped(doc, tmp_path):
    """The file's commands in order, in a sandbox holding the repo's examples and configs."""
    for name in ("examples", "configs", "helm", "crds"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for produced in PRODUCED.get(doc, ()):
        run(["rlkube", "model", "init", "--out", produced], tmp_path, env)
    unrunnable = []
    for number, command, comment in (row[1:] for row in ALL if row[0] == doc):
        where = f"{doc}:{number}: {command}"
        if mapping(command):
            continue
        if command.startswith("python3 -c "):
            run(["bash", "-c", command], tmp_path, env)
            continue
        argv = shlex.split(command)
        if argv[0] == "rlkube-operator":
            check_operator_arguments(argv[1:], tmp_path, where)
            continue
        assigned = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
            name, _, value = argv.pop(0).partition("=")
            assigned[name] = value
        if not argv or argv[0] != "rlkube" or len(argv) < 2:
            unrunnable.append(where)
            continue
        if argv[1] in DRY_RUN and "--dry-run" not in argv and "--help" not in argv:
            argv.append("--dry-run")
        elif not (argv[1:3] == ["model", "init"] or "--help" in argv or "--dry-run" in argv):
            unrunnable.append(where)
            continue
        result = run(argv, tmp_path, {**env, **assigned}, check=False)
        expected = 2 if "refused" in comment else 0
        assert result.returncode == expected, f"{where}\nexit {result.returncode}\n{result.stderr[-2000:]}"
    assert not unrunnable, "commands neither run nor mapped (tests/docs/test_docs_commands.py):\n" + "\n".join(unrunnable)


def check_operator_arguments(argv: list[str], cwd: Path, where: str) -> None:
    from rlkube_operator.main import parse_args
    from rlkube_operator.runtoken import read_key

    args = parse_args(argv)
    assert args.all_namespaces or args.namespace, f"{where}: no namespace to watch"
    read_key(args.token_key_file and str(cwd / args.token_key_file))


def run(argv, cwd, env, check=True):
    result = subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, f"{argv}: {result.stderr[-2000:]}"
    return result


def test_mapped_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for doc, number, command, _ in ALL:
        for target in mapping(command) or ():
            if target.startswith("Makefile:"):
                assert re.search(rf"^{re.escape(target[9:])}:", makefile, re.MULTILINE), f"{doc}:{number}: {target}"
            else:
                file, _, function = target.partition("::")
                assert (ROOT / file).exists(), f"{doc}:{number}: {command} -> {target}"
                if function:
                    assert re.search(rf"^(async )?def {function}\(", (ROOT / file).read_text(), re.MULTILINE), \
                        f"{doc}:{number}: {command} -> {target}: no such test"
