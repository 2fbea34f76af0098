"""A model name as a local directory: the trainer builds from it, and inference reads the
base weights a LoRA adapter merges into from it."""

import os
from pathlib import Path


def checkpoint_dir(name: str) -> Path:
    """The local directory of model `name`: itself, or a hub id's download (the hub's cache)."""
    if os.path.isdir(name):
        return Path(name)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]))
