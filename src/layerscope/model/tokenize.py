"""Tokenizing texts into the inputs a model takes: ``Encoder`` makes right-padded ``Batch``es.

The tokenizer is the Hugging Face one or, for an export that verified it gives the same ids,
the ``tokenizers``-only ``FastTokenizer`` (model/fast_tokenizer.py); the input names are the
model's (the families table).  Engines run a ``Batch``; nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.errors import InputError

# Characters of a text kept per token of max length before tokenizing. Only the first max_length tokens of
# a text reach the model, and a token covers at most about 100 characters of text (WordPiece reads a word
# of up to 100 characters as one token, longer ones as one [UNK]; byte-level BPE and SentencePiece tokens
# are shorter), so 128 characters per token keep every character that can matter while a 20 MB line is no
# longer tokenized whole (its token list and offsets took gigabytes). The cut is made at a space, and used
# only when the kept part still holds more than max_length tokens, so the tokens the model sees are the
# same as without it; a cut text counts among the truncated ones.
TEXT_CHARS_PER_TOKEN = 128


@dataclass
class Batch:
    inputs: dict[str, np.ndarray]  # int64 arrays named as the model's inputs
    index: np.ndarray  # row positions of these texts in the corpus
    truncated: np.ndarray  # bool per text: longer than max length
    # with ``Encoder(..., details=True)``: per token, 1 for special tokens (BOS, CLS, SEP, pad) and the
    # character span [start, end) in the text as given (a prompt's characters are not counted)
    special: np.ndarray | None = None  # uint8 [batch, seq]
    spans: np.ndarray | None = None  # int32 [batch, seq, 2]

    @property
    def mask(self) -> np.ndarray:
        return self.inputs["attention_mask"]

    @property
    def input_ids(self) -> np.ndarray:
        return self.inputs["input_ids"]

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


def min_max_length(tokenizer, prompt: str = "") -> int:
    """The smallest max length that keeps a token of text: the special tokens the tokenizer adds (and the
    prompt's tokens) plus one. Below it a tokenizer either drops the text whole or, unable to cut its
    special tokens, does not truncate at all (a fast BERT tokenizer asked for 1 token returns them all)."""
    enc = tokenizer([prompt], add_special_tokens=True, truncation=False, return_attention_mask=False,
                    return_token_type_ids=False, verbose=False)
    return len(enc["input_ids"][0]) + 1


def check_room(tokenizer, max_length: int, prompt: str = "") -> None:
    """One line refusing a max length that cannot keep any text (see ``min_max_length``)."""
    least = min_max_length(tokenizer, prompt)
    if int(max_length) < least:
        what = "its special tokens" + (" and the prompt" if prompt else "")
        raise InputError(f"--max-length {max_length} leaves no room for text: this model's tokenizer adds "
                         f"{least - 1} tokens ({what}) to every text; use at least {least}")


def _cut_at_space(text: str, cap: int) -> str:
    """The first ``cap`` characters of ``text``, ending before the last whitespace among them (in the second
    half), so no word is split."""
    head = text[:cap]
    for k in range(len(head) - 1, cap // 2, -1):
        if head[k].isspace():
            return head[:k]
    return head


class Encoder:
    """Tokenizes texts into the inputs a model expects, right-padded, truncated at ``max_length``."""

    def __init__(self, tokenizer, input_names: list[str], max_length: int, prompt: str = ""):
        self.tokenizer = tokenizer
        self.input_names = list(input_names)
        self.max_length = int(max_length)
        self.prompt = prompt or ""  # put before every text, as sentence-transformers' prompts are
        self.details = False  # the default of __call__'s ``details``
        self.cut = 0  # texts cut to TEXT_CHARS_PER_TOKEN * max_length characters before tokenizing
        check_room(tokenizer, self.max_length, self.prompt)

    def _prompted(self, texts) -> list[str]:
        texts = self._kept(texts)
        return [self.prompt + t for t in texts] if self.prompt else texts

    def _kept(self, texts) -> list[str]:
        """``texts``, each longer than ``TEXT_CHARS_PER_TOKEN * max_length`` characters cut there (at the last
        space), when what is kept still fills max length; ``self.cut`` counts the texts cut."""
        texts = list(texts)
        cap = TEXT_CHARS_PER_TOKEN * self.max_length
        long = [i for i, t in enumerate(texts) if len(t) > cap]
        if not long:
            return texts
        kept = [_cut_at_space(texts[i], cap) for i in long]
        enc = self.tokenizer([self.prompt + t for t in kept], add_special_tokens=True, truncation=False,
                             return_attention_mask=False, return_token_type_ids=False, verbose=False)
        for i, text, ids in zip(long, kept, enc["input_ids"]):
            if len(ids) > self.max_length:  # else (mostly spaces) the whole text is read, as it must be
                texts[i] = text
                self.cut += 1
        return texts

    @property
    def fallback_token_id(self) -> int:
        tok = self.tokenizer
        for value in (tok.eos_token_id, tok.bos_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id):
            if value is not None:
                return int(value)
        return 0

    def token_lengths(self, texts: list[str]) -> np.ndarray:
        """Token counts without truncation (special tokens included), for sorting and warnings."""
        enc = self.tokenizer(self._prompted(texts), add_special_tokens=True, truncation=False,
                             return_attention_mask=False, return_token_type_ids=False, verbose=False)
        return np.fromiter((max(len(ids), 1) for ids in enc["input_ids"]), dtype=np.int64, count=len(texts))

    def __call__(self, texts: list[str], index: np.ndarray | None = None,
                 lengths: np.ndarray | None = None, *, details: bool | None = None) -> Batch:
        """A right-padded batch; ``details`` adds each token's special-token flag and character span."""
        texts = list(texts)
        if lengths is None:
            lengths = self.token_lengths(texts)
        details = self.details if details is None else details
        extra = {"return_offsets_mapping": True, "return_special_tokens_mask": True} if details else {}
        try:
            enc = self.tokenizer(self._prompted(texts), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="np", verbose=False, **extra)
        except NotImplementedError:  # a slow (Python) tokenizer has no character offsets
            raise InputError("this model's tokenizer gives no character offsets (a slow tokenizer); token-level "
                             "extraction needs a fast (tokenizers-backed) one") from None
        enc = {k: np.asarray(v) for k, v in enc.items()}
        special = enc.pop("special_tokens_mask", None)
        offsets = enc.pop("offset_mapping", None)
        if enc["input_ids"].shape[1] == 0:  # every text in the batch tokenized to nothing
            enc = {k: np.zeros((len(texts), 1), dtype=np.int64) for k in enc}
        mask = enc["attention_mask"].astype(np.int64)
        empty = np.nonzero(mask.sum(1) == 0)[0]
        if len(empty):
            # A text with no tokens at all (an empty line, for a tokenizer that adds no special
            # tokens, e.g. GPT-2) is fed as the model's EOS token alone, so every row gets a vector.
            enc["input_ids"][empty, 0] = self.fallback_token_id
            mask[empty, 0] = 1
        inputs: dict[str, np.ndarray] = {}
        for name in self.input_names:
            if name == "position_ids":
                inputs[name] = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)
            elif name == "token_type_ids" and name not in enc:
                inputs[name] = np.zeros_like(mask)
            elif name in enc:
                inputs[name] = enc[name].astype(np.int64)
            else:
                raise InputError(f"the model wants an input '{name}' that its tokenizer does not make")
        inputs["attention_mask"] = mask
        idx = np.arange(len(texts)) if index is None else np.asarray(index)
        batch = Batch(inputs=inputs, index=idx, truncated=np.asarray(lengths) > self.max_length)
        if details:
            batch.special, batch.spans = self._details(special, offsets, mask, empty)
        return batch

    def _details(self, special, offsets, mask: np.ndarray, empty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(special uint8 [b, s], spans int32 [b, s, 2]) shaped as ``mask``; spans count from the text's
        first character (after the prompt); a token inside the prompt or a special token has span (0, 0)."""
        if special is None or offsets is None:
            raise InputError("this model's tokenizer gives no character offsets (a slow tokenizer); token-level "
                             "extraction needs a fast (tokenizers-backed) one")
        shape = mask.shape
        special = np.asarray(special, dtype=np.uint8).reshape(shape[0], -1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(shape[0], -1, 2)
        if special.shape[1] < shape[1]:  # every text tokenized to nothing: one fallback column
            special = np.ones(shape, dtype=np.uint8)
            offsets = np.zeros(shape + (2,), dtype=np.int64)
        special[empty, 0] = 1  # the fallback token fed for an empty text
        spans = offsets - len(self.prompt)
        inside = (spans[..., 0] < 0) | (special == 1)
        spans[inside] = 0
        return special, np.clip(spans, 0, None).astype(np.int32)
