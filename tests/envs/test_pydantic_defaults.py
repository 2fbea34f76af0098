"""The default-factory memo gives pydantic the same answers, computed once per factory."""

import pytest
from pydantic import BaseModel, Field
from rlkube.envs import pydantic_defaults


class Model(BaseModel):
    a: int = 1
    items: list = Field(default_factory=list)
    b: int = Field(default_factory=lambda data: data["a"] + 1)


@pytest.fixture
def asked(monkeypatch):
    """Each factory pydantic's own check is asked about, in order."""
    calls = []
    original = pydantic_defaults._takes_validated_data
    monkeypatch.setattr(pydantic_defaults, "_known", {})
    monkeypatch.setattr(pydantic_defaults, "_takes_validated_data", lambda f: calls.append(f) or original(f))
    pydantic_defaults.remember_default_factory_signatures()
    return calls


def test_model_construct_asks_once_per_factory_and_keeps_validated_data_factories(asked):
    for a in (5, 7, 9):
        model = Model.model_construct(a=a)
        assert model.items == [] and model.b == a + 1  # the data-taking factory still gets the data
    assert Model().b == 2 and Model(a=3).b == 4  # validation
    assert len(asked) == 2 and list in asked


def test_verifiers_trace_nodes_stop_asking_inspect(asked):
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode

    for _ in range(3):
        node = MessageNode.model_construct(message=vf.UserMessage(content="abc"), token_ids=[1, 2])
        assert node.logprobs == [] and node.semantic_parents == [] and node.timestamp > 0
    assert len(asked) == len(set(map(id, asked))) <= 3
