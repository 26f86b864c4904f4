"""Build a random-weight checkpoint of a real model shape (no download): config from the published
shape, weights seeded random (saved as safetensors), tokenizer trained on a few sentences with the
``tokenizers`` library in the family's format (the test-suite's tiny-model tokenizers).

    python benchmarks/models/build.py qwen2.5-3b /tmp/shapes/qwen2.5-3b [--dtype fp16]

Shapes are written by hand from the models' published config.json files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

QWEN = dict(rope_theta=1_000_000.0, tie_word_embeddings=True, use_sliding_window=False, vocab_size=151936,
            max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu")
SHAPES: dict[str, tuple[str, str, dict]] = {
    # name: (tiny family for the tokenizer, config class, published shape)
    "bert-base": ("bert", "BertConfig", dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                                             num_attention_heads=12, intermediate_size=3072,
                                             max_position_embeddings=512, type_vocab_size=2)),
    "gpt2": ("gpt2", "GPT2Config", dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024)),
    "gpt2-medium": ("gpt2", "GPT2Config", dict(vocab_size=50257, n_embd=1024, n_layer=24, n_head=16,
                                               n_positions=1024)),
    "flan-t5-large-encoder": ("t5-encoder", "T5Config", dict(vocab_size=32128, d_model=1024, d_kv=64, d_ff=2816,
                                                             num_layers=24, num_heads=16, feed_forward_proj="gated-gelu",
                                                             tie_word_embeddings=False, relative_attention_num_buckets=32,
                                                             relative_attention_max_distance=128)),
    "qwen2.5-0.5b": ("qwen2", "Qwen2Config", dict(QWEN, hidden_size=896, intermediate_size=4864,
                                                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)),
    "qwen2.5-1.5b": ("qwen2", "Qwen2Config", dict(QWEN, hidden_size=1536, intermediate_size=8960,
                                                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2)),
    "qwen2.5-3b": ("qwen2", "Qwen2Config", dict(QWEN, hidden_size=2048, intermediate_size=11008,
                                                num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2)),
    "qwen3-0.6b": ("qwen3", "Qwen3Config", dict(QWEN, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                                num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                                max_position_embeddings=40960)),
}
# Shapes of the architectures layerscope derives (model/families.py): built from the model type's own config
# class, with the zoo's tokenizer of that type (tests/tiny_zoo.py); (model type, class saved, published shape).
LLAMA32_ROPE = dict(rope_type="llama3", factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                    original_max_position_embeddings=8192)
ZOO_SHAPES: dict[str, tuple[str, str, dict]] = {
    "all-mpnet-base-v2": ("mpnet", "AutoModel", dict(vocab_size=30527, hidden_size=768, num_hidden_layers=12,
                                                     num_attention_heads=12, intermediate_size=3072,
                                                     max_position_embeddings=514, relative_attention_num_buckets=32)),
    "distilbert-base": ("distilbert", "AutoModel", dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12,
                                                        hidden_dim=3072, max_position_embeddings=512)),
    "modernbert-base": ("modernbert", "AutoModelForMaskedLM", dict(
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
        global_attn_every_n_layers=3, local_attention=128, max_position_embeddings=8192)),
    "pythia-410m": ("gpt_neox", "AutoModelForCausalLM", dict(
        vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True, tie_word_embeddings=False)),
    "llama-3.2-1b": ("llama", "AutoModelForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rope_theta=500000.0, rope_scaling=LLAMA32_ROPE,
        max_position_embeddings=131072, tie_word_embeddings=True, rms_norm_eps=1e-5)),
    # EmbeddingGemma's shape
    "gemma-3-270m": ("gemma3_text", "AutoModelForCausalLM", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768,
        rope_theta=1_000_000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=256, tie_word_embeddings=True)),
    # fp32 weights 29 GB, fp16 14.5 GB: the export goes over 2 GiB (external data) either way
    "mistral-7b": ("mistral", "AutoModelForCausalLM", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, sliding_window=4096, max_position_embeddings=32768,
        rope_theta=10000.0, tie_word_embeddings=False)),
}
MODEL_CLASS = {"bert": "BertModel", "gpt2": "GPT2LMHeadModel", "t5-encoder": "T5EncoderModel",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def with_layers(shape_cfg: dict, num_layers: int | None) -> dict:
    """The published shape at its own width with ``num_layers`` blocks: a model too large for this machine's
    memory measured at its real width and a depth that fits (every per-layer figure is the same per block)."""
    if num_layers is None:
        return shape_cfg
    key = next(k for k in LAYER_KEYS if k in shape_cfg)
    if not 0 < num_layers <= shape_cfg[key]:
        raise SystemExit(f"--num-layers must be between 1 and the shape's {shape_cfg[key]} layers")
    return {**shape_cfg, key: num_layers}


def build(shape: str, out: Path, dtype: str = "fp32", seed: int = 0, num_layers: int | None = None) -> dict:
    import torch
    import transformers

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_tiny_model

    if shape in ZOO_SHAPES:
        return build_zoo_shape(shape, out, dtype, seed, num_layers)
    family, cfg_cls, shape_cfg = SHAPES[shape]
    shape_cfg = with_layers(shape_cfg, num_layers)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # the tiny model of the family lends its trained tokenizer
        tiny = build_tiny_model(family, Path(tmp) / "tiny", seed=seed)
        tiny_cfg = json.loads((tiny / "config.json").read_text())
        for f in tiny.iterdir():
            if f.name not in ("config.json", "model.safetensors"):
                shutil.copy(f, out / f.name)
    tok_cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["model_max_length"] = shape_cfg.get("max_position_embeddings", shape_cfg.get("n_positions", 512))
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2))
    keep = {k: tiny_cfg[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
            if tiny_cfg.get(k) is not None}
    config = getattr(transformers, cfg_cls)(**{**keep, **shape_cfg})
    torch.manual_seed(seed)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # initialize in the saved dtype: a 3B model never exists in fp32
    try:
        model = getattr(transformers, MODEL_CLASS[family])(config).eval()
    finally:
        torch.set_default_dtype(prev)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True, max_shard_size="20GB")
    return {"shape": shape, "params": params, "dtype": dtype, "build_seconds": round(time.perf_counter() - t0, 1)}


def build_zoo_shape(shape: str, out: Path, dtype: str = "fp32", seed: int = 0, num_layers: int | None = None) -> dict:
    """A ``ZOO_SHAPES`` shape: the model type's config class, the zoo's tokenizer of that type."""
    import torch
    import transformers

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_zoo import _tokenizer

    model_type, cls_name, shape_cfg = ZOO_SHAPES[shape]
    shape_cfg = with_layers(shape_cfg, num_layers)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tok = _tokenizer(model_type)
    tok.model_max_length = min(shape_cfg.get("max_position_embeddings", 512), 8192)
    tok.save_pretrained(out)
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
               bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)
    config = transformers.AutoConfig.for_model(model_type, **{**ids, **shape_cfg})
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype])
    try:
        model = getattr(transformers, cls_name).from_config(config).eval()
    finally:
        torch.set_default_dtype(prev)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True, max_shard_size="20GB")
    return {"shape": shape, "params": params, "dtype": dtype, "build_seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES) + sorted(ZOO_SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"], help="weights as saved")
    ap.add_argument("--num-layers", type=int, help="build the shape's width with this many blocks")
    args = ap.parse_args()
    print(json.dumps(build(args.shape, args.out, args.dtype, num_layers=args.num_layers)))


if __name__ == "__main__":
    main()
