"""A BERT checkpoint with random (seeded) weights and bert-base shapes, for speed runs offline.

Speed and the fraction of compute peak depend on the shapes, not the weights; the
hub is off here, so the bert-base-uncased vocabulary comes from the installed
all-MiniLM-L6-v2 package (the same 30,522-token uncased WordPiece).

    python benchmarks/random_bert.py /tmp/bert-base-random
    inspect export /tmp/bert-base-random -o /tmp/bert-base-random-export
    inspect bench -m /tmp/bert-base-random-export -e ort,ov --peers none --sts PATH/sts-test.csv --sts-texts
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(out: str) -> None:
    import torch
    from transformers import BertConfig, BertModel

    from layerscope.model.source import resolve_source

    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, feed-forward 3072
    BertModel(config).eval().save_pretrained(target, safe_serialization=True)
    vocab_dir = Path(resolve_source("minilm").path_or_id)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (vocab_dir / name).exists():
            shutil.copy(vocab_dir / name, target / name)
    print(target)


if __name__ == "__main__":
    main(sys.argv[1])
