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
MODEL_CLASS = {"bert": "BertModel", "gpt2": "GPT2LMHeadModel", "t5-encoder": "T5EncoderModel",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def build(shape: str, out: Path, dtype: str = "fp32", seed: int = 0) -> dict:
    import torch
    import transformers

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_tiny_model

    family, cfg_cls, shape_cfg = SHAPES[shape]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"], help="weights as saved")
    args = ap.parse_args()
    print(json.dumps(build(args.shape, args.out, args.dtype)))


if __name__ == "__main__":
    main()
