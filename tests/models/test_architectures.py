"""The architectures shipped for offline meta builds match the models they name: each one's
parameter count, built on the meta device, is the one its Hugging Face model card gives."""

import pytest
import torch
from rlkube.config import ModelConfig
from rlkube.models.architectures import KNOWN, model_architecture
from rlkube.trainer.model import build_meta_model

from tests.fixtures.hub import hub_offline

CARDS = {  # (parameters, non-embedding parameters), in billions as each card rounds them
    "Qwen/Qwen3-0.6B": ("0.6", "0.44"),
    "Qwen/Qwen3-1.7B": ("1.7", "1.4"),
    "Qwen/Qwen3-4B": ("4.0", "3.6"),
    "Qwen/Qwen3-8B": ("8.2", "6.95"),
    "Qwen/Qwen3-30B-A3B": ("30.5", "29.9"),
}


def test_every_known_architecture_has_its_model_card():
    assert set(KNOWN) == set(CARDS)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_meta_build_has_the_model_cards_parameter_counts(name, monkeypatch):
    hub_offline(monkeypatch)  # from the table, never the network
    model = build_meta_model(ModelConfig(name=name))
    assert all(p.device == torch.device("meta") for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    embeddings = sum(m.weight.numel() for m in (model.get_input_embeddings(), model.get_output_embeddings())
                     if not (m is model.get_output_embeddings() and model.config.tie_word_embeddings))
    params, non_embedding = CARDS[name]
    decimals = len(params.split(".")[1])
    assert f"{total / 1e9:.{decimals}f}" == params
    assert f"{(total - embeddings) / 1e9:.{len(non_embedding.split('.')[1])}f}" == non_embedding


def test_a_local_directory_wins_over_the_table(tiny_model):
    """A name that is a directory is read from its own config.json."""
    assert model_architecture(str(tiny_model)).hidden_size != KNOWN["Qwen/Qwen3-0.6B"]["hidden_size"]
