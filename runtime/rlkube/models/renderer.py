"""Which `renderers` renderer a local model gets.

`renderers` resolves its hand-written renderers by exact hub name (`Qwen/Qwen3-0.6B`), so a
local directory (a tiny model, a fine-tune, an exported checkpoint) would fall back to the
generic `apply_chat_template` renderer. verifiers' training client takes an explicit
`renderers.RendererConfig`; this picks it: the renderer named in the directory's
`rlkube_model.json` (written by `rlkube model init`), or Qwen3's when the directory's chat
template is byte-identical to Qwen3's.
"""

import json
from pathlib import Path


def renderer_name_for(model_name_or_path: str | Path) -> str | None:
    """`"qwen3"` for a local Qwen3-templated model directory; None lets `renderers` decide."""
    from rlkube.models.tiny import qwen3_chat_template

    path = Path(model_name_or_path)
    if not path.is_dir():
        return None
    meta = path / "rlkube_model.json"
    if meta.is_file():
        return json.loads(meta.read_text()).get("renderer")
    template = path / "chat_template.jinja"
    if template.is_file():
        text = template.read_text()
    elif (tok_config := path / "tokenizer_config.json").is_file():
        text = json.loads(tok_config.read_text()).get("chat_template")
    else:
        return None
    return "qwen3" if text == qwen3_chat_template() else None


def renderer_config_for(model_name_or_path: str | Path):
    """The `renderers.RendererConfig` for a model, or None (auto-resolution by hub name)."""
    name = renderer_name_for(model_name_or_path)
    if name is None:
        return None
    from renderers.configs import _config_class_for

    return _config_class_for(name)()
