"""Data: every input reader and generator (imports nothing of layerscope but errors and its own modules).

- corpora for extraction: ``corpus`` (entry point, ``records_of`` for in-memory sources) with one module
  per format (``corpus_detect``, ``corpus_lines``, ``corpus_jsonl``, ``corpus_csv``, ``corpus_parquet``)
  and ``hf_dataset`` (Hugging Face datasets);
- analysis inputs: ``pairs`` (scored STS pairs, also the bench's ``--sts``), ``aligned`` (source/target
  pairs), ``items`` (compositionality items), ``examples`` (built-in texts, labeled files);
- generators: ``bilingual``, ``synthetic`` (the bench's seeded corpus); small data written for this project."""

from __future__ import annotations

EXAMPLE_SENTENCES = (
    "A man is playing a guitar on a quiet street.",
    "Someone plays the guitar outside.",
    "The dog bites the man.",
    "The man bites the dog.",
    "A woman is slicing an onion in the kitchen.",
    "An onion is being cut by a woman.",
    "Three children run across a snowy field.",
    "Stock markets fell sharply after the announcement.",
    "The committee postponed its decision until next spring.",
    "A cat sleeps on a warm windowsill.",
    "一个人正在弹吉他。",
    "The train to the airport leaves every fifteen minutes.",
)


def example_sentences() -> list[str]:
    """A dozen short sentences for the quickstart when no corpus is at hand."""
    return list(EXAMPLE_SENTENCES)
