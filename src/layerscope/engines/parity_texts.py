"""The texts a derived computation is checked on against its source: mixed lengths (padding), a non-Latin
script, digits and symbols, and one text of a few hundred tokens.

A half-precision PyTorch engine checks itself on them against fp32 at start (``torch.py``), and early exit
checks a pruned graph on them against the full one (``truncate.py``).
"""

PARITY_TEXTS = (
    "A man is playing a guitar.",
    "Hi",
    "一个人正在弹吉他。",
    "Numbers like 3.14159 and 2,718 appear here; so do symbols: #, @, & and %!",
    " ".join(["Two dogs play in the snow while their owners watch from a bench near the frozen lake."] * 12),
)
