"""The two baseline rows of the bench: the plain Hugging Face loop (``hf-eager``, also the fp32
reference every engine is measured against) and ``SentenceTransformer.encode``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from layerscope.bench.timing import Clock, Run, timing

if TYPE_CHECKING:
    from layerscope.bench.config import BenchConfig

HF_EAGER = "hf-eager"
ST = "sentence-transformers"
BASELINES = (HF_EAGER, ST)
# what the sentence-transformers rows are held to where the checkpoint has a recipe layerscope reproduces
OWN_REFERENCE = (f"{HF_EAGER}: the checkpoint's own embedding (its recipe over the model's own last hidden state)")


def require_code_flag(handle) -> None:
    """One line, before any row runs, where the bench's model ran the model's own code and the user did not pass
    --trust-remote-code: the reference row (hf-eager), the PyTorch engines and the sentence-transformers peers load
    the model through that code, and a manifest never turns it on."""
    from layerscope.model.own_code import require_code_flag as required

    required(handle.manifest, handle.spec, handle.trust_remote_code, f"the bench's reference row ({HF_EAGER})")


def own_recipe(manifest):
    """The checkpoint's sentence-transformers recipe where layerscope reproduces it, else None."""
    st = manifest.sentence_transformers or {}
    return st if st.get("supported") and st.get("pooling") else None


def own_embedding(out, mask, recipe):
    """The checkpoint's own sentence embedding as sentence-transformers computes it, from a plain Hugging Face
    forward: the recipe's pooling over the model's own last hidden state (not layer L where the model applies
    its final norm after it: ModernBERT), L2-normalized where the recipe says. The reference of the
    sentence-transformers rows."""
    import torch

    from layerscope.vocab.pooling import pool_torch

    vec = pool_torch(out.last_hidden_state.float(), mask, recipe["pooling"])
    return torch.nn.functional.normalize(vec, dim=-1) if recipe.get("normalize") else vec


def hf_eager_row(cfg: BenchConfig, source, family, num_layers: int, layers: list[str], n_acc: int, recipe=None):
    """The plain loop: corpus order, fixed batch size, every hidden state, pooling in torch. ``recipe``: the
    checkpoint's sentence-transformers recipe, whose own embedding of the accuracy rows it also returns."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layerscope.bench.machine import PeakMemory
    from layerscope.vocab.pooling import pool_torch

    run = Run(HF_EAGER, "baseline", f"plain Hugging Face loop, batch {cfg.hf_batch_size}, corpus order")
    t0 = time.perf_counter()
    trust = cfg.trust_remote_code is True  # the user's flag, never None: no interactive prompt
    tok = AutoTokenizer.from_pretrained(source.path_or_id, trust_remote_code=trust)
    net = AutoModel.from_pretrained(source.path_or_id, use_safetensors=True, dtype=torch.float32,
                                    trust_remote_code=trust).eval()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    max_len = cfg.max_length or cfg.extra["max_length"]
    setup = time.perf_counter() - t0
    word_emb = net.get_input_embeddings()

    own: list[np.ndarray] = []

    def encode(texts: list[str], keep_own: bool = False) -> np.ndarray:
        enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        with torch.inference_mode():
            out = net(**enc, output_hidden_states=True)
            states = [word_emb(enc["input_ids"]) if name == "raw" else out.hidden_states[int(name)]
                      for name in layers]
            pooled = [pool_torch(s, enc["attention_mask"], cfg.pooling) for s in states]
            if keep_own and recipe:
                own.append(own_embedding(out, enc["attention_mask"], recipe).numpy())
        return torch.stack(pooled).numpy(), int(enc["attention_mask"].sum())

    texts = cfg.texts
    encode(texts[: min(8, len(texts))])  # warm-up
    vectors = np.zeros((len(layers), n_acc, cfg.extra["hidden_size"]), np.float32)
    lat, tokens = [], 0
    with PeakMemory() as mem, Clock() as clock:
        for lo in range(0, len(texts), cfg.hf_batch_size):
            t = time.perf_counter()
            v, n_tok = encode(texts[lo:lo + cfg.hf_batch_size], keep_own=lo < n_acc)
            lat.append(time.perf_counter() - t)
            tokens += n_tok
            hi = min(lo + cfg.hf_batch_size, n_acc)
            if lo < n_acc:
                vectors[:, lo:hi] = v[:, : hi - lo]
    run.result.update(timing(len(texts), tokens, clock, lat, setup, mem))
    run.result["provider"] = f"torch-cpu ({torch.get_num_threads()} threads)"

    def sts_encode(sentences: list[str]) -> np.ndarray:
        out = []
        for lo in range(0, len(sentences), cfg.hf_batch_size):
            out.append(encode(sentences[lo:lo + cfg.hf_batch_size])[0])
        return np.concatenate(out, axis=1)

    return run, vectors, sts_encode, (np.concatenate(own)[:n_acc] if own else None)


def st_row(cfg: BenchConfig, source, n_acc: int):
    from pathlib import Path

    from layerscope.bench.machine import PeakMemory

    run = Run(ST, "baseline", f"SentenceTransformer.encode, batch {cfg.st_batch_size}, final layer only")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        run.fail("sentence-transformers is not installed (pip install 'layerscope[compare]')")
        return run, None, None
    if not (source.is_local and (Path(source.path_or_id) / "modules.json").exists()):
        run.fail(f"{source.spec} is not a local sentence-transformers model (no modules.json)")
        return run, None, None
    t0 = time.perf_counter()
    model = SentenceTransformer(source.path_or_id, device="cpu", trust_remote_code=cfg.trust_remote_code is True)
    if cfg.max_length:
        model.max_seq_length = cfg.max_length
    setup = time.perf_counter() - t0
    model.encode(cfg.texts[:8], batch_size=cfg.st_batch_size, show_progress_bar=False)  # warm-up
    with PeakMemory() as mem, Clock() as clock:
        vecs = model.encode(cfg.texts, batch_size=cfg.st_batch_size, convert_to_numpy=True, show_progress_bar=False)
    tokens = int(sum(len(ids) for ids in model.tokenizer(cfg.texts, truncation=True,
                                                         max_length=model.max_seq_length)["input_ids"]))
    run.result.update(timing(len(cfg.texts), tokens, clock, [], setup, mem))
    run.result["provider"] = "torch-cpu"
    run.result["latency_note"] = "its own batching: per-batch latency not observable"
    run.result["layers"] = "final only"

    def sts_encode(sentences: list[str]) -> np.ndarray:
        return model.encode(sentences, batch_size=cfg.st_batch_size, convert_to_numpy=True,
                            show_progress_bar=False)[None]

    return run, vecs[:n_acc][None].astype(np.float32), sts_encode
