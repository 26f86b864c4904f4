"""The analyses by name: ``@register`` adds a class, ``registry()`` finds every analysis module first."""

from __future__ import annotations

from typing import Any

_REGISTRY: dict[str, Any] = {}


def register(cls):
    """Class decorator: the analysis becomes ``layerscope run NAME`` (NAME from its metadata)."""
    _REGISTRY[cls.metadata.name] = cls
    return cls


def registry() -> dict[str, Any]:
    from layerscope.analyses import _load_all

    _load_all()
    return dict(_REGISTRY)


def get_analysis(name: str):
    reg = registry()
    if name not in reg:
        from layerscope.errors import unknown_name

        raise unknown_name("analysis", name, sorted(reg))
    return reg[name]
