"""A tiny random BERT checkpoint for the variant and bench tests (no network).

Used when the shared ``tiny_model`` fixture (tests/tiny_models.py) is not in
this checkout; both build the same kind of directory: config.json,
model.safetensors, a WordPiece tokenizer trained on a few sentences.
"""

from __future__ import annotations

from pathlib import Path

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
    "Embedding models turn sentences into vectors.",
    "Each layer refines the hidden states a little.",
    "She bought 3 apples and 12 oranges at the market.",
    "Two dogs play in the snow near the frozen lake.",
    "Similar sentences should have similar embeddings.",
    "The weather today is sunny with a light breeze.",
]


def build_tiny_bert(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(SENTENCES * 4, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=64)
    fast.save_pretrained(str(out))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(str(out), safe_serialization=True)
    return out
