"""The texts a bench runs over: a corpus file, seeded synthetic texts, or both sides of an STS file's pairs."""

from __future__ import annotations

from pathlib import Path

from layerscope.errors import InputError


def bench_texts(*, corpus: str | None = None, synthetic: int | None = None, sts_texts: bool = False,
                sts: str | None = None, seed: int = 0, profile: str = "mixed") -> tuple[list[str], str]:
    """``(texts, corpus name for the report)`` from exactly one of ``corpus``, ``synthetic`` or ``sts_texts``."""
    if (corpus is not None) + (synthetic is not None) + sts_texts != 1:
        raise InputError("give exactly one of --corpus FILE, --synthetic N or --sts-texts (with --sts FILE)")
    if synthetic is not None:
        from layerscope.data.synthetic import synthetic_texts

        return synthetic_texts(synthetic, seed=seed, profile=profile), f"synthetic-{profile} (seed {seed})"
    if sts_texts:
        from layerscope.data.pairs import read_sts

        if not sts:
            raise InputError("--sts-texts reads the sentences of --sts FILE: give --sts too")
        s1, s2, _ = read_sts(sts)
        return [t for pair in zip(s1, s2) for t in pair], f"{Path(sts).name} sentences (both sides of each pair)"
    from layerscope.data.corpus import iter_corpus

    return [r.text for r in iter_corpus(corpus)], Path(corpus).name
