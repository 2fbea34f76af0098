"""The committed gRPC stubs match rlkube.proto (regenerate with `make proto`)."""

from pathlib import Path

from tests.fixtures import prerequisites

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
STUBS = ["rlkube_pb2.py", "rlkube_pb2.pyi", "rlkube_pb2_grpc.py"]


def test_stubs_are_fresh(tmp_path):
    protoc = prerequisites.import_module("grpc_tools.protoc", "grpcio-tools, from the dev extra")
    args = ["protoc", f"-I{RUNTIME}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}", str(RUNTIME / "rlkube/transport/rlkube.proto")]
    assert protoc.main(args) == 0
    for name in STUBS:
        fresh = (tmp_path / "rlkube/transport" / name).read_text()
        committed = (RUNTIME / "rlkube/transport" / name).read_text()
        assert fresh == committed, f"rlkube/transport/{name} is stale: run `make proto`"
