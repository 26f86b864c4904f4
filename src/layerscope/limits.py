"""Batching and engine options, checked before anything is written or any model is loaded.

``None`` always means "the default"; an explicit 0 or a negative number is refused (it used to
fall back to the default silently for --batch-tokens and --threads).
"""

from __future__ import annotations

from layerscope.errors import InputError


def _positive(flag: str, value, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{flag} must be a whole number of {what}, not {value!r}")
    if value < 1:
        raise InputError(f"{flag} must be at least 1 {what.rstrip('s')}, not {value}; leave it out for the default")


def check_limits(*, batch_tokens=None, max_batch=None, max_length=None, threads=None) -> None:
    """Refuse zero, negative or non-integer batching options (``None``: the default)."""
    _positive("--batch-tokens", batch_tokens, "tokens")
    _positive("--max-batch", max_batch, "texts")
    _positive("--max-length", max_length, "tokens")
    _positive("--threads", threads, "threads")


def check_max_length(max_length, manifest, spec: str = "the model") -> None:
    """``--max-length`` within 1 .. the model's own limit: its positions (``length_limit`` of its manifest), not
    its tokenizer's ``model_max_length``, which a longer ``--max-length`` overrides."""
    if max_length is None:
        return
    _positive("--max-length", max_length, "tokens")
    limit = manifest.length_limit  # the typed Manifest (model/manifest_type.py)
    if limit is not None and max_length > int(limit):
        if manifest.positions is None and manifest.max_length_from == "tokenizer model_max_length":
            raise InputError(f"--max-length {max_length} is above the {int(limit)} tokens {spec} was exported for "
                             "(its tokenizer's model_max_length, recorded before layerscope recorded the model's "
                             "positions): export it again to read up to its positions")
        raise InputError(f"--max-length {max_length} is above what {spec} can read ({int(limit)} tokens, "
                         f"its position limit); use at most {int(limit)}")


def check_engine_options(options: dict | None) -> None:
    """The options handed to an engine: ``threads`` at least 1."""
    if options:
        _positive("--threads", options.get("threads"), "threads")
