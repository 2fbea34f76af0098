"""The committed gRPC stubs match rlkube.proto (regenerate with `make proto`)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.fixtures import prerequisites

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
STUBS = ["rlkube_pb2.py", "rlkube_pb2.pyi", "rlkube_pb2_grpc.py"]


def test_stubs_are_fresh(tmp_path):
    """protoc runs in its own process, as `make proto` runs it: grpc_tools' bundled protobuf and
    NIXL's libraries crash a process that loads both (a test before this one may have loaded NIXL)."""
    if importlib.util.find_spec("grpc_tools") is None:
        prerequisites.require("grpcio-tools is not installed (the dev extra)")
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{RUNTIME}", f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", str(RUNTIME / "rlkube/transport/rlkube.proto")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for name in STUBS:
        fresh = (tmp_path / "rlkube/transport" / name).read_text()
        committed = (RUNTIME / "rlkube/transport" / name).read_text()
        assert fresh == committed, f"rlkube/transport/{name} is stale: run `make proto`"
