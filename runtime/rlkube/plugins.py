"""User code named by import path in a config (`package.module:name`): custom losses and
advantages."""

import importlib


def import_callable(path: str, field: str):
    """The callable at `path`, or an error naming the config `field` and what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{field}: '{path}' is not 'package.module:function'")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{field}: cannot import '{path}': {e}") from None
    if not callable(obj):
        raise TypeError(f"{field}: '{path}' is not callable")
    return obj
