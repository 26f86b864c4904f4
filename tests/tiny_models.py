"""Tiny random checkpoints of every model family layerscope supports.

``build_tiny_model(family, out_dir)`` writes a directory laid out exactly like a
Hugging Face checkpoint (``config.json`` + ``model.safetensors`` + tokenizer
files).  The weights are random (seeded), the tokenizer is *trained* on
:data:`TRAINING_SENTENCES` with the ``tokenizers`` library, so nothing is ever
downloaded from the hub.  Every checkpoint loads with the ordinary ``Auto*``
classes, offline.

Shapes shared by all families: hidden size 32, 2 layers, 4 attention heads
(Qwen: 4 query heads, 2 key/value heads, head_dim 8), intermediate size 64,
128 positions (RoBERTa: 128 + 2, CLIP text: 77), vocabulary = size of the
trained tokenizer (a few hundred tokens; CLIP ~630 because, like the real one,
it keeps all 256 bytes twice: plain and with the ``</w>`` end-of-word suffix).

Where a real checkpoint has a peculiarity that downstream code must cope with,
the tiny one copies it on purpose, e.g.:

* RoBERTa: ``pad_token_id == 1`` and positions start at ``padding_idx + 1``.
* DeBERTa-v3: ``[MASK]`` is an added token at the very end of the vocabulary,
  ``type_vocab_size == 0``, relative attention with ``position_buckets``.
* CLIP: the whole ``CLIPModel`` (with a vision tower) is saved; ``<|startoftext|>``
  and ``<|endoftext|>`` are the last two ids; pad is ``<|endoftext|>``.
* T5: an encoder-decoder (``T5ForConditionalGeneration``) is saved, the
  tokenizer appends ``</s>`` but no BOS, ``<pad>`` is id 0, sentinel
  ``<extra_id_N>`` tokens are appended.
* GPT-2 / Qwen: no BOS/EOS added by the tokenizer; ``<|endoftext|>`` is an
  added token at the end of the byte-level BPE vocabulary.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import torch
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

FAMILIES = ("bert", "roberta", "deberta-v2", "clip-text", "t5-encoder", "gpt2", "qwen2", "qwen3")

HIDDEN = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS  # 8
INTERMEDIATE = 64
MAX_POSITIONS = 128
CLIP_MAX_POSITIONS = 77

TRAINING_SENTENCES: list[str] = [
    "The quick brown fox jumps over the lazy dog.",
    "A cat sat quietly on the warm windowsill all afternoon.",
    "Embedding models turn sentences into vectors of numbers.",
    "Each layer of a transformer refines the hidden states a little.",
    "Researchers often compare the first and the last layers.",
    "She bought 3 apples, 12 oranges and 7 pears at the market.",
    "The train leaves at 08:45 and arrives at 17:30.",
    "In 2024 the library had 1,250 members and 30,000 books.",
    "Please call me back at 555-0199 before Friday.",
    "Mixing colors is easier than mixing metaphors, isn't it?",
    "He didn't know whether the bridge would hold.",
    "We're going to the mountains; they'll stay at home.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The river flows slowly through the old stone town.",
    "Neural networks learn patterns from large amounts of data.",
    "Tokenizers split text into words, subwords or bytes.",
    "Similar sentences should have similar embeddings.",
    "The weather today is sunny with a light breeze.",
    "My grandmother bakes bread every Sunday morning.",
    "Quantum computers may one day break classical encryption.",
    "Dogs are loyal companions and love long walks.",
    "The meeting was postponed until next Tuesday.",
    "Fresh coffee smells wonderful early in the morning!",
    "Mathematics is the language in which nature is written.",
    "The children played football in the park until sunset.",
    "Version 2.3.1 fixed a bug in the export of hidden states.",
    "Is this the fastest way to compute cosine similarity?",
    "Pooling averages the token vectors into one sentence vector.",
    "Astronomers discovered a new planet orbiting a distant star.",
    "The museum opens at nine and closes at five.",
    "Learning a new language takes patience and practice.",
    '"Hello," she said, "how are you doing today?"',
    "Prices rose by 4.5% over the last 12 months.",
    "Rain, snow, wind and fog: every season has its charm.",
    "我喜欢学习自然语言处理。",
    "今天天气很好，我们去公园散步吧。",
    "这个模型有12层，每层有768个隐藏单元。",
    "北京是中国的首都，有2100万人口。",
    "Machine translation turns 中文 into English and back.",
    "The year 2025 started on a Wednesday, 1 January.",
    "Bright stars shine over the quiet sea at night.",
    "Good tests are small, fast and deterministic.",
]


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE uses for the 256 byte values, in byte order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table: dict[int, str] = {}
    shift = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return [table[b] for b in range(256)]


def _train(tok: Tokenizer, trainer) -> Tokenizer:
    tok.train_from_iterator(TRAINING_SENTENCES, trainer=trainer)
    return tok


def _mark_special(tok: Tokenizer, tokens: list[str]) -> None:
    """Register ``tokens`` as special added tokens (appended to the vocab when new)."""
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in tokens])


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def _add_pooler(model, base, pooler) -> None:
    """Give a *ForMaskedLM model's base a pooler, as real BERT/RoBERTa checkpoints have.

    bert-base-uncased / roberta-base declare ``*ForMaskedLM`` but their weights
    also contain ``pooler.dense``.  Without it, ``AutoModel.from_pretrained``
    would initialise a fresh random pooler on every load (non-deterministic
    ``pooler_output``).
    """
    base.pooler = pooler
    pooler.apply(model._init_weights)


def _save_model(model, out_dir: Path) -> None:
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)


# The WordPiece and Unigram trainers of `tokenizers` are not deterministic
# (hash-map iteration order breaks ties, so two builds differ in vocabulary and
# ids).  Byte/char-level BPE training with a fixed, complete initial alphabet
# is, so WordPiece and Unigram vocabularies are derived from such a BPE run.


def _corpus_words(normalizer, pre_tokenizer) -> Counter:
    words: Counter = Counter()
    for sentence in TRAINING_SENTENCES:
        normalized = normalizer.normalize_str(sentence)
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalized))
    return words


def _char_bpe(words: Counter, vocab_size: int) -> tuple[Tokenizer, list[str]]:
    """Deterministic char-level BPE over already pre-tokenized ``words``."""
    alphabet = sorted({ch for w in words for ch in w})
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator((" ".join([w] * n) for w, n in sorted(words.items())), trainer=trainer)
    return tok, alphabet


def _wordpiece_vocab(words: Counter, specials: list[str], vocab_size: int) -> dict[str, int]:
    """BERT-style vocab: specials, every char plain and as ``##c``, then learned pieces."""
    bpe, alphabet = _char_bpe(words, vocab_size)
    initial: set[str] = set()
    continuing: set[str] = set()
    for word in words:
        pieces = [t.value for t in bpe.model.tokenize(word)]
        initial.add(pieces[0])
        continuing.update(pieces[1:])
    vocab: dict[str, int] = {}
    for piece in specials + alphabet + ["##" + c for c in alphabet]:
        vocab.setdefault(piece, len(vocab))
    for piece, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1]):  # merge order
        if piece in initial:
            vocab.setdefault(piece, len(vocab))
        if piece in continuing:
            vocab.setdefault("##" + piece, len(vocab))
    return vocab


def _unigram_vocab(words: Counter, specials: list[str], vocab_size: int) -> list[tuple[str, float]]:
    """SentencePiece-style vocab: specials (score 0), then pieces by log-frequency, best first."""
    bpe, _ = _char_bpe(words, vocab_size - len(specials))
    pieces = sorted(bpe.get_vocab())
    counts = {p: sum(w.count(p) * n for w, n in words.items()) for p in pieces}
    total = sum(counts.values())
    scored = sorted(((p, math.log(max(counts[p], 1) / total)) for p in pieces), key=lambda ps: (-ps[1], ps[0]))
    return [(s, 0.0) for s in specials] + scored


def _metaspace_unigram(specials: list[str], unk: str, vocab_size: int) -> Tokenizer:
    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    vocab = _unigram_vocab(_corpus_words(normalizer, pre_tokenizer), specials, vocab_size)
    tok = Tokenizer(models.Unigram(vocab, unk_id=specials.index(unk), byte_fallback=False))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    return tok


# Qwen-style pre-tokenization regex (contractions, letter runs, single digits,
# punctuation runs, newlines, whitespace).
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# CLIP-style: the two specials, contractions, letter runs, single digits, punctuation runs.
_CLIP_SPLIT = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"


def _byte_level_bpe(vocab_size: int, specials: list[str], *, add_prefix_space: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return _train(tok, trainer)


# --------------------------------------------------------------------------- #
# families
# --------------------------------------------------------------------------- #


def _build_bert(out_dir: Path, seed: int) -> None:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
    from transformers.models.bert.modeling_bert import BertPooler

    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab = _wordpiece_vocab(
        _corpus_words(normalizer, pre_tokenizer), ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], 300
    )
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    _mark_special(tok, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    hf_tok = BertTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=True,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)

    config = BertConfig(
        vocab_size=len(hf_tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        pad_token_id=hf_tok.pad_token_id,
    )
    _seeded(seed)
    model = BertForMaskedLM(config)
    _add_pooler(model, model.bert, BertPooler(config))
    _save_model(model, out_dir)


def _build_roberta(out_dir: Path, seed: int) -> None:
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast
    from transformers.models.roberta.modeling_roberta import RobertaPooler

    # RoBERTa order: <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> last among the specials.
    tok = _byte_level_bpe(400, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.post_processor = processors.RobertaProcessing(
        sep=("</s>", tok.token_to_id("</s>")),
        cls=("<s>", tok.token_to_id("<s>")),
        trim_offsets=True,
        add_prefix_space=False,
    )
    hf_tok = RobertaTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True),
        add_prefix_space=False,
        trim_offsets=True,
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)
    assert hf_tok.pad_token_id == 1

    config = RobertaConfig(
        vocab_size=len(hf_tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        # positions are numbered from padding_idx + 1, hence the + 2
        max_position_embeddings=MAX_POSITIONS + 2,
        type_vocab_size=1,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
    )
    _seeded(seed)
    model = RobertaForMaskedLM(config)
    _add_pooler(model, model.roberta, RobertaPooler(config))
    _save_model(model, out_dir)


def _build_deberta_v2(out_dir: Path, seed: int) -> None:
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM, DebertaV2TokenizerFast

    # DeBERTa-v3 layout: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, [MASK] added at the end.
    tok = _metaspace_unigram(["[PAD]", "[CLS]", "[SEP]", "[UNK]"], "[UNK]", 400)
    _mark_special(tok, ["[PAD]", "[CLS]", "[SEP]", "[UNK]"])
    _mark_special(tok, ["[MASK]"])  # not in the vocab yet: appended, like DeBERTa-v3's id 128000
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    # No spm.model is written: DebertaV2TokenizerFast loads from tokenizer.json alone.
    hf_tok = DebertaV2TokenizerFast(
        tokenizer_object=tok,
        do_lower_case=False,
        bos_token="[CLS]",
        eos_token="[SEP]",
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)

    config = DebertaV2Config(
        vocab_size=len(hf_tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        hidden_act="gelu",
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        relative_attention=True,
        max_relative_positions=-1,
        position_buckets=256,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pad_token_id=hf_tok.pad_token_id,
    )
    _seeded(seed)
    _save_model(DebertaV2ForMaskedLM(config), out_dir)


def _clip_tokenizer() -> Tokenizer:
    """CLIP-style BPE: lowercase, byte-level, ``</w>`` end-of-word suffix, specials last."""
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    alphabet = _byte_alphabet()
    trained = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    trained.normalizer = normalizer
    trained.pre_tokenizer = pre_tokenizer
    _train(
        trained,
        trainers.BpeTrainer(
            vocab_size=420 + 256,
            initial_alphabet=alphabet,
            end_of_word_suffix="</w>",
            # Passed as "special tokens" only so that every "<byte></w>" symbol
            # gets a fixed id before training: otherwise they are numbered in
            # hash-map order and merge ties break differently on every run.
            special_tokens=[c + "</w>" for c in alphabet],
            show_progress=False,
        ),
    )
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split(" "))
        for m in json.loads(trained.to_str())["model"]["merges"]
    ]

    # Real CLIP vocab: 256 bytes, the same 256 bytes + "</w>", the merges in
    # order, then <|startoftext|>, <|endoftext|>.  Rebuild it in that order so
    # that every byte (also unseen ones, e.g. other CJK characters) is covered.
    vocab: dict[str, int] = {}
    for piece in alphabet + [c + "</w>" for c in alphabet] + ["".join(m) for m in merges]:
        vocab.setdefault(piece, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)

    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<|endoftext|>", end_of_word_suffix="</w>", fuse_unk=False)
    )
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    _mark_special(tok, ["<|startoftext|>", "<|endoftext|>"])
    tok.post_processor = processors.RobertaProcessing(
        sep=("<|endoftext|>", vocab["<|endoftext|>"]),
        cls=("<|startoftext|>", vocab["<|startoftext|>"]),
        add_prefix_space=False,
        trim_offsets=False,
    )
    return tok


def _build_clip_text(out_dir: Path, seed: int) -> None:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    hf_tok = CLIPTokenizerFast(
        tokenizer_object=_clip_tokenizer(),
        unk_token="<|endoftext|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",  # as in the real openai/clip checkpoints
        model_max_length=CLIP_MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)
    # Like a real CLIP checkpoint, ship the image preprocessing config as well.
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out_dir)

    config = CLIPConfig(
        text_config={
            "vocab_size": len(hf_tok),
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "projection_dim": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "max_position_embeddings": CLIP_MAX_POSITIONS,
            "hidden_act": "quick_gelu",
            # the real ids (not the legacy eos_token_id=2), so CLIPTextTransformer
            # pools at the first <|endoftext|> instead of argmax(input_ids)
            "bos_token_id": hf_tok.bos_token_id,
            "eos_token_id": hf_tok.eos_token_id,
            "pad_token_id": hf_tok.pad_token_id,
        },
        vision_config={
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "projection_dim": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "image_size": 32,
            "patch_size": 16,
            "hidden_act": "quick_gelu",
        },
        projection_dim=HIDDEN,
    )
    _seeded(seed)
    _save_model(CLIPModel(config), out_dir)


def _build_t5_encoder(out_dir: Path, seed: int) -> None:
    from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast

    # T5 layout: <pad>=0 </s>=1 <unk>=2, sentinels <extra_id_N> appended at the end.
    tok = _metaspace_unigram(["<pad>", "</s>", "<unk>"], "<unk>", 300)
    _mark_special(tok, ["<pad>", "</s>", "<unk>"])
    eos_id = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 </s>:0", pair="$A:0 </s>:0 $B:1 </s>:1", special_tokens=[("</s>", eos_id)]
    )
    hf_tok = T5TokenizerFast(
        tokenizer_object=tok,
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_ids=8,
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)
    assert hf_tok.pad_token_id == 0

    config = T5Config(
        vocab_size=len(hf_tok),
        d_model=HIDDEN,
        d_kv=HEAD_DIM,
        d_ff=INTERMEDIATE,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,  # flan-t5 / t5 v1.1 style
        pad_token_id=hf_tok.pad_token_id,
        eos_token_id=hf_tok.eos_token_id,
        decoder_start_token_id=hf_tok.pad_token_id,
    )
    _seeded(seed)
    _save_model(T5ForConditionalGeneration(config), out_dir)


def _build_gpt2(out_dir: Path, seed: int) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tok = _byte_level_bpe(400, [])
    # As in GPT-2, <|endoftext|> is the last id of the vocabulary.
    _mark_special(tok, ["<|endoftext|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf_tok = GPT2TokenizerFast(
        tokenizer_object=tok,
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        # GPT-2 has no pad token.  Users batch it by setting pad_token = eos_token,
        # and so do we here, so that the saved tokenizer pads out of the box.
        pad_token="<|endoftext|>",
        add_prefix_space=False,
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)

    config = GPT2Config(
        vocab_size=len(hf_tok),
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=INTERMEDIATE,
        n_positions=MAX_POSITIONS,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
    )
    _seeded(seed)
    _save_model(GPT2LMHeadModel(config), out_dir)


def _qwen_tokenizer():
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    _train(
        tok,
        trainers.BpeTrainer(
            vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    _mark_special(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_POSITIONS,
        padding_side="right",
    )


def _qwen_common(hf_tok) -> dict:
    return dict(
        vocab_size=len(hf_tok),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=hf_tok.eos_token_id,  # Qwen configs use <|endoftext|> for both
        eos_token_id=hf_tok.eos_token_id,
    )


def _build_qwen2(out_dir: Path, seed: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_tok = _qwen_tokenizer()
    hf_tok.save_pretrained(out_dir)
    config = Qwen2Config(**_qwen_common(hf_tok))
    _seeded(seed)
    _save_model(Qwen2ForCausalLM(config), out_dir)


def _build_qwen3(out_dir: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_tok = _qwen_tokenizer()
    hf_tok.save_pretrained(out_dir)
    config = Qwen3Config(head_dim=HEAD_DIM, **_qwen_common(hf_tok))
    _seeded(seed)
    _save_model(Qwen3ForCausalLM(config), out_dir)


_BUILDERS = {
    "bert": _build_bert,
    "roberta": _build_roberta,
    "deberta-v2": _build_deberta_v2,
    "clip-text": _build_clip_text,
    "t5-encoder": _build_t5_encoder,
    "gpt2": _build_gpt2,
    "qwen2": _build_qwen2,
    "qwen3": _build_qwen3,
}
assert tuple(_BUILDERS) == FAMILIES


def build_tiny_model(family: str, out_dir: Path, *, seed: int = 0) -> Path:
    """Build and save a tiny random model of `family` to out_dir; return out_dir."""
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _BUILDERS[family](out_dir, seed)
    return out_dir


def first_block_of(bert: Path, out_dir: Path) -> Path:
    """A copy of the tiny BERT checkpoint ``bert`` with its first block alone: the same weights, a model of
    another depth (for figures that overlay models of different depth)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    out_dir = Path(shutil.copytree(bert, out_dir))
    config = json.loads((out_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    weights = load_file(str(out_dir / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if ".layer.1." not in k}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir
