"""Tokenization on the ``tokenizers`` library alone, for the ONNX engines.

Loading a Hugging Face tokenizer imports transformers and with it torch: about
five seconds before the first text is encoded, most of what ``layerscope search``
or a small ``layerscope extract`` costs.  The Rust tokenizer in ``tokenizer.json``
is the same one a fast Hugging Face tokenizer wraps, so an export dir can be
served without transformers.  The export checks, on its validation texts, that
this path gives exactly the ids, masks and type ids Hugging Face gives, and only
then records ``"fast_tokenizer": true`` in the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_IDS = ("eos_token_id", "bos_token_id", "sep_token_id", "pad_token_id", "unk_token_id")


def special_ids(hf_tokenizer) -> dict[str, int | None]:
    """The special token ids the encoder needs, read from a Hugging Face tokenizer at export time."""
    return {name: getattr(hf_tokenizer, name, None) for name in SPECIAL_IDS}


class FastTokenizer:
    """The slice of the Hugging Face tokenizer call that ``model.tokenize.Encoder`` uses."""

    def __init__(self, path: str | Path, ids: dict[str, int | None]):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        for name in SPECIAL_IDS:
            setattr(self, name, ids.get(name))
        if self.pad_token_id is None:
            raise ValueError("the fast tokenizer needs a pad token id")

    def __call__(self, texts: list[str], *, add_special_tokens: bool = True, truncation: bool = False,
                 max_length: int | None = None, padding: bool = False, return_tensors: str | None = None,
                 return_attention_mask: bool = True, return_token_type_ids: bool = True,
                 return_offsets_mapping: bool = False, return_special_tokens_mask: bool = False,
                 verbose: bool = False) -> dict[str, Any]:
        tk = self.tokenizer
        if truncation and max_length:
            tk.enable_truncation(int(max_length))
        else:
            tk.no_truncation()
        if padding:
            tk.enable_padding(direction="right", pad_id=int(self.pad_token_id))
        else:
            tk.no_padding()
        encodings = tk.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings]}
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in encodings]
        if return_token_type_ids:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if return_special_tokens_mask:
            out["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_tensors == "np":
            width = max((len(ids) for ids in out["input_ids"]), default=0)
            out = {k: np.asarray(v, dtype=np.int64).reshape(len(encodings), width, *((2,) if k == "offset_mapping"
                                                                                     else ()))
                   for k, v in out.items()}
        return out


def matches_hf(fast: FastTokenizer, hf_tokenizer, texts: list[str], max_lengths: tuple[int, ...]) -> bool:
    """True when the fast path gives exactly Hugging Face's ids, masks and lengths on ``texts``."""
    for max_length in max_lengths:
        ref = hf_tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np",
                           verbose=False)
        got = fast(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if key in ref and not np.array_equal(np.asarray(ref[key]), got[key]):
                return False
    ref_lengths = [len(ids) for ids in hf_tokenizer(texts, add_special_tokens=True, truncation=False,
                                                    verbose=False)["input_ids"]]
    got_lengths = [len(ids) for ids in fast(texts, add_special_tokens=True)["input_ids"]]
    return ref_lengths == got_lengths
