"""Each run's token derived from the operator's key (`runtoken`): stable for a run, different
for another run or another key, and an operator without a usable key refuses to start, naming
the setting."""

import pytest
from rlkube_operator import builders
from rlkube_operator.main import main
from rlkube_operator.names import RunRef
from rlkube_operator.runtoken import MIN_KEY_BYTES, run_token

KEY = b"k" * MIN_KEY_BYTES
RUN = RunRef("RLRun", "rt", "ml", "0f1e2d3c-uid")


def test_a_run_always_gets_the_same_token_and_another_run_or_key_another():
    token = run_token(KEY, RUN.uid)
    assert token == run_token(KEY, RUN.uid)
    assert len(token) == 43 and token.isascii()  # as secrets.token_urlsafe(32): 256 bits
    assert run_token(KEY, "another-uid") != token
    assert run_token(b"j" * MIN_KEY_BYTES, RUN.uid) != token
    assert builders.build_token_secret(RUN, KEY) == builders.build_token_secret(RUN, KEY)
    assert builders.build_token_secret(RUN, KEY)["immutable"] is True


@pytest.mark.parametrize(("key", "said"), [
    (None, "--token-key-file is required"),
    (b"short", f"has 5 bytes; at least {MIN_KEY_BYTES} are needed"),
    ("missing", "cannot read"),
])
def test_an_operator_without_a_usable_key_refuses_to_start_naming_the_setting(tmp_path, capsys, key, said):
    args = ["--namespace", "ml"]
    if key == "missing":
        args.append(f"--token-key-file={tmp_path / 'absent'}")
    elif key is not None:
        (tmp_path / "key").write_bytes(key + b"\n")
        args.append(f"--token-key-file={tmp_path / 'key'}")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--token-key-file" in err and said in err
