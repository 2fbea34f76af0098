"""`rlkube` itself: the command table and its errors."""

from rlkube.entrypoints.main import COMMANDS, main


def test_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command_exits_2(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
