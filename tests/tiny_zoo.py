"""Tiny random checkpoints of every common text architecture, built from transformers' config classes.

``build_zoo_model(model_type, out_dir)`` saves a checkpoint (``config.json``, ``model.safetensors``,
tokenizer files) of hidden size 32, two layers, four heads (two key/value heads where the architecture
groups them), with the model's own LM head (masked-LM for encoders, causal-LM for decoders) so the lens
has a trained-shape head.  Tokenizers are the small ones trained in ``tiny_models.py`` (a few hundred
tokens, so embeddings stay small):

* encoders: a WordPiece tokenizer with ``[CLS] ... [SEP]`` (BERT style), pad id 0;
* decoders: a byte-level BPE; ``llama``-style types get a BOS added in front of every text and NO pad
  token (layerscope pads with EOS), the others add nothing and pad with ``<|endoftext|>``.

Architecture facts the tests must meet are set on purpose: sliding windows of 4 tokens (Mistral,
Gemma-2/3, ModernBERT's local attention) so validation texts run past them; Gemma's soft-capping;
mixture-of-experts with 48 experts, 2 per token (more than a short trace routes to); parallel attention blocks (GPT-J, Phi, Falcon, GPT-NeoX);
OPT of equal widths here (its projection to a narrower word_embed_proj_dim: tests/export/test_opt_projection.py).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from tiny_models import MAX_POSITIONS, _corpus_words, _mark_special, _qwen_tokenizer, _wordpiece_vocab

ENCODERS = ("bert", "roberta", "xlm-roberta", "camembert", "deberta-v2", "mpnet", "distilbert", "albert",
            "electra", "modernbert", "t5", "mt5", "umt5", "clip_text_model")
DECODERS = ("gpt2", "gpt_neox", "gptj", "gpt_neo", "opt", "bloom", "llama", "mistral", "mixtral", "qwen2",
            "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo2",
            "falcon", "stablelm", "granite", "smollm3")
MODEL_TYPES = ENCODERS + DECODERS
T5_TYPES = ("t5", "mt5", "umt5")  # encoder-decoder checkpoints whose encoder stack is exported

H, L, A, KV, D, FF = 32, 2, 4, 2, 8, 64
WINDOW = 4  # sliding windows shorter than most validation texts
# decoders whose real tokenizers add a BOS and have no pad token
BOS_NO_PAD = ("llama", "mistral", "mixtral", "gemma", "gemma2", "gemma3_text", "phi3", "granite")

_ROTARY = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
               intermediate_size=FF, max_position_embeddings=MAX_POSITIONS)
# more experts than the 9-token export trace routes to: a trace that kept only the experts it saw would
# leave some out, and the parity texts reach them
_MOE = dict(num_experts=48, num_experts_per_tok=2, moe_intermediate_size=16)

SHAPES: dict[str, dict] = {
    "bert": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                 max_position_embeddings=MAX_POSITIONS),
    "roberta": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                    max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1),
    "deberta-v2": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                       max_position_embeddings=MAX_POSITIONS, relative_attention=True, position_buckets=32,
                       pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0),
    "mpnet": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                  max_position_embeddings=MAX_POSITIONS + 2, relative_attention_num_buckets=32),
    "distilbert": dict(dim=H, n_layers=L, n_heads=A, hidden_dim=FF, max_position_embeddings=MAX_POSITIONS),
    "albert": dict(embedding_size=16, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
                   intermediate_size=FF, max_position_embeddings=MAX_POSITIONS),
    "electra": dict(embedding_size=16, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
                    intermediate_size=FF, max_position_embeddings=MAX_POSITIONS),
    "modernbert": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                       max_position_embeddings=MAX_POSITIONS, local_attention=WINDOW, global_attn_every_n_layers=2),
    "t5": dict(d_model=H, d_kv=D, d_ff=FF, num_layers=L, num_decoder_layers=L, num_heads=A,
               relative_attention_num_buckets=8, relative_attention_max_distance=16),
    "clip_text_model": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                            max_position_embeddings=77, projection_dim=H),
    "gpt2": dict(n_embd=H, n_layer=L, n_head=A, n_inner=FF, n_positions=MAX_POSITIONS),
    "gpt_neox": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                     max_position_embeddings=MAX_POSITIONS, rotary_pct=0.25, use_parallel_residual=True),
    "gptj": dict(n_embd=H, n_layer=L, n_head=A, n_inner=FF, n_positions=MAX_POSITIONS, rotary_dim=4),
    "gpt_neo": dict(hidden_size=H, num_layers=L, num_heads=A, intermediate_size=FF,
                    max_position_embeddings=MAX_POSITIONS, attention_types=[[["global", "local"], 1]],
                    window_size=WINDOW),
    "opt": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, ffn_dim=FF,
                max_position_embeddings=MAX_POSITIONS, word_embed_proj_dim=H, do_layer_norm_before=True),
    "bloom": dict(hidden_size=H, n_layer=L, n_head=A),
    "llama": dict(_ROTARY, head_dim=D),
    "mistral": dict(_ROTARY, head_dim=D, sliding_window=WINDOW),
    "mixtral": dict(_ROTARY, head_dim=D, num_local_experts=48, num_experts_per_tok=2, sliding_window=None),
    "qwen2": dict(_ROTARY),
    "qwen2_moe": dict(_ROTARY, **_MOE, shared_expert_intermediate_size=32, decoder_sparse_step=1),
    "qwen3": dict(_ROTARY, head_dim=D),
    "qwen3_moe": dict(_ROTARY, head_dim=D, **_MOE, decoder_sparse_step=1),
    "gemma": dict(_ROTARY, head_dim=D),
    "gemma2": dict(_ROTARY, head_dim=D, sliding_window=WINDOW, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, query_pre_attn_scalar=D),
    "gemma3_text": dict(_ROTARY, head_dim=D, sliding_window=WINDOW, query_pre_attn_scalar=D,
                        layer_types=["sliding_attention", "full_attention"]),
    "phi": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF,
                max_position_embeddings=MAX_POSITIONS, partial_rotary_factor=0.5),
    "phi3": dict(_ROTARY, pad_token_id=None),
    "olmo2": dict(_ROTARY),
    "falcon": dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_kv_heads=1,
                   parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=False),
    "stablelm": dict(_ROTARY, partial_rotary_factor=0.25),
    "granite": dict(_ROTARY, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
                    logits_scaling=4.0),
    "smollm3": dict(_ROTARY, no_rope_layers=[1, 0], use_sliding_window=False),
}
SHAPES["xlm-roberta"] = SHAPES["camembert"] = SHAPES["roberta"]
SHAPES["mt5"] = SHAPES["umt5"] = SHAPES["t5"]


def wordpiece_tokenizer(specials: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")):
    """A small BERT-style fast tokenizer (``[CLS] text [SEP]``; pad id 0, or where ``specials`` puts it)."""
    from transformers import BertTokenizerFast

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                            lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    specials = list(specials)
    tok = Tokenizer(models.WordPiece(_wordpiece_vocab(_corpus_words(normalizer, pre), specials, 300),
                                     unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre, decoders.WordPiece(prefix="##")
    _mark_special(tok, specials)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                             cls_token="[CLS]", mask_token="[MASK]", bos_token="[CLS]", eos_token="[SEP]",
                             model_max_length=MAX_POSITIONS, padding_side="right")


def bos_tokenizer():
    """A byte-level BPE that puts ``<s>`` before every text and has no pad token (Llama style)."""
    from transformers import PreTrainedTokenizerFast

    base = _qwen_tokenizer()
    tok = base.backend_tokenizer
    _mark_special(tok, ["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   model_max_length=MAX_POSITIONS, padding_side="right")


def _tokenizer(model_type: str):
    if model_type == "mpnet":  # MPNet numbers positions after id 1, its real pad id, whatever the config says
        return wordpiece_tokenizer(("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"))
    if model_type in ENCODERS:
        return wordpiece_tokenizer()
    return bos_tokenizer() if model_type in BOS_NO_PAD else _qwen_tokenizer()


def build_zoo_model(model_type: str, out_dir: Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``model_type`` checkpoint (with its LM head where it has one) into ``out_dir``."""
    import torch
    import transformers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(model_type)
    tok.save_pretrained(out_dir)
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
               bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)
    if model_type in T5_TYPES:
        ids["decoder_start_token_id"] = tok.pad_token_id
    shape = {**ids, **SHAPES[model_type]}
    config = transformers.AutoConfig.for_model(model_type, vocab_size=len(tok), **shape)
    torch.manual_seed(seed)
    if model_type in T5_TYPES:
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    elif model_type == "clip_text_model":
        model = transformers.CLIPTextModel(config)
    elif model_type in ENCODERS:
        model = transformers.AutoModelForMaskedLM.from_config(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
