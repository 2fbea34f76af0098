import pytest


@pytest.fixture(autouse=True)
def empty_working_directory(tmp_path_factory, monkeypatch):
    """Run each test from an empty directory: `rlkube rl`'s default model is the relative
    `outputs/tiny-model`, and an `outputs/` left in the checkout by an example run would make
    every dry run of the default config fail on that path first."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
