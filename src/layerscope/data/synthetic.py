"""A reproducible synthetic corpus: seeded, mixed-length, word-like text from a fixed vocabulary.

Real corpora cannot be shipped or fetched here, and large scale runs need
millions of texts; this generator gives the same texts for the same seed on
every machine.  Lengths follow a mixture that looks like a retrieval corpus:
many short sentences, a body of medium ones, a tail of paragraphs.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from layerscope.errors import InputError

_WORDS = """
the a an of to in on at for with from by about over under between through after before during
and or but so because while if when although though since until unless whereas
i you he she it we they me him her us them my your his its our their this that these those
is are was were be been being has have had do does did will would can could may might must should
time year day week month hour morning evening night people man woman child family friend group
world country city town village street house home room door window table chair bed kitchen garden
water river lake sea ocean mountain hill forest tree flower grass stone rock sand snow rain wind sun
moon star sky cloud light fire earth air road bridge train car bus ship plane bicycle station airport
school student teacher class lesson book paper letter word sentence story page language question answer
work job office company market shop money price cost bank business manager worker team project plan
game music song film picture camera phone computer network data model system program code software
science research study theory result method experiment test measure number value level rate point
health doctor hospital medicine food bread coffee tea milk fruit apple orange vegetable dinner lunch
dog cat horse bird fish cow sheep animal insect farm field crop season summer winter spring autumn
good new first last long great little own other old right big high different small large next early
young important few public bad same able quiet fast slow warm cold bright dark simple clear strong
make go know take see come think look want give use find tell ask seem feel try leave call keep
play run walk read write learn build open close begin show hear turn move live believe hold bring
happen sit stand lose pay meet include continue set change lead understand watch follow stop create
speak allow add spend grow offer remember love consider appear buy wait serve die send expect stay
quickly slowly often never always sometimes again still already almost together away around
very really quite rather just only even also too well back then now here there today tomorrow
""".split()

_PROFILES = {
    # (weight, min words, max words) per length band
    "mixed": ((0.50, 3, 14), (0.35, 15, 45), (0.15, 46, 160)),
    "short": ((0.70, 2, 8), (0.30, 9, 16)),
    "long": ((0.20, 20, 60), (0.80, 61, 220)),
}
PROFILES = tuple(_PROFILES)


def synthetic_texts(n: int, *, seed: int = 0, profile: str = "mixed") -> list[str]:
    """``n`` texts; the same ``(n, seed, profile)`` always gives the same list."""
    return list(iter_synthetic(n, seed=seed, profile=profile))


def iter_synthetic(n: int, *, seed: int = 0, profile: str = "mixed") -> Iterator[str]:
    """Stream ``n`` synthetic texts (constant memory, for million-text runs).

    Texts are drawn in fixed chunks, so the first k texts are the same whatever ``n`` is.
    """
    chunk = 4096
    if n < 1:
        raise InputError(f"--synthetic needs a positive number of texts, not {n}")
    if profile not in _PROFILES:
        raise InputError(f"unknown synthetic profile '{profile}'; choose from {', '.join(PROFILES)}")
    bands = _PROFILES[profile]
    weights = np.array([b[0] for b in bands])
    rng = np.random.default_rng(seed)
    vocab = np.array(_WORDS)
    # Zipf-like word frequencies, as in real text
    freq = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    freq /= freq.sum()
    done = 0
    while done < n:
        m = chunk
        band = rng.choice(len(bands), size=m, p=weights / weights.sum())
        lo = np.array([bands[b][1] for b in band])
        hi = np.array([bands[b][2] for b in band])
        lengths = rng.integers(lo, hi + 1)
        words = vocab[rng.choice(len(vocab), size=int(lengths.sum()), p=freq)]
        numbers = rng.integers(0, 10_000, size=m)
        with_number = rng.random(m) < 0.15
        punct = rng.choice(np.array([".", ".", ".", "?", "!"]), size=m)
        start = 0
        for i in range(min(m, n - done)):
            ws = list(words[start:start + lengths[i]])
            start += lengths[i]
            if with_number[i]:
                ws.insert(int(numbers[i]) % len(ws), str(int(numbers[i])))
            if len(ws) > 12:  # a comma in longer sentences
                ws[len(ws) // 2] += ","
            ws[0] = ws[0].capitalize()
            yield " ".join(ws) + str(punct[i])
        done += m
