"""Peak memory of long texts, measured on real processes (the child's own high-water mark, ``VmHWM``, read as it
exits): a corpus of many texts each longer than the batch budget holds no more than a few of them do (each runs
alone, nothing is kept across batches), within 3x of what engines/memory.py says one text's activations cost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")
MiB = 2 ** 20
# the CLI in a child that writes its peak resident set (VmHWM, per process image: a forked parent's memory does
# not count, as it does in ru_maxrss) to the file named by its first argument as it exits
CHILD = """
import atexit, re, runpy, sys
where = sys.argv.pop(1)
def peak():
    kib = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
    open(where, "w").write(kib)
atexit.register(peak)
sys.argv[0] = "layerscope"
runpy.run_module("layerscope", run_name="__main__")
"""

POSITIONS = 2048
WORDS = "the quick brown fox jumps over the lazy dog "


@pytest.fixture(scope="module")
def long_export(tiny_model, tmp_path_factory) -> Path:
    """The tiny BERT with 2,048 positions (random weights, the same tokenizer), exported."""
    import torch
    from transformers import AutoConfig, BertModel

    from layerscope.export.exporter import export_model

    from layerscope.model.source import resolve_source

    src = tiny_model("bert")
    where = tmp_path_factory.mktemp("long-bert")
    model_dir = where / "model"
    model_dir.mkdir()
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(f, model_dir / f.name)
    tok_cfg = model_dir / "tokenizer_config.json"
    cfg = json.loads(tok_cfg.read_text(encoding="utf-8"))
    cfg["model_max_length"] = POSITIONS
    tok_cfg.write_text(json.dumps(cfg), encoding="utf-8")
    config = AutoConfig.from_pretrained(str(src))
    config.max_position_embeddings = POSITIONS
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(model_dir, safe_serialization=True)
    export_model(resolve_source(str(model_dir)), where / "onnx")
    return where / "onnx"


def _extract_peak(export: Path, texts: list[str], out: Path, batch_tokens: int) -> int:
    corpus = out.parent / f"{out.name}.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    peak = out.parent / f"{out.name}.peak"
    cmd = [sys.executable, "-c", CHILD, str(peak), "extract", "--model", str(export), "--engine", "ort",
           "--input", str(corpus), "--out", str(out), "--pooling", "mean", "--batch-tokens", str(batch_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=SRC), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    return int(peak.read_text()) * 1024


@pytest.mark.slow
def test_long_texts_peak_memory_is_one_texts_not_the_corpus(long_export, tmp_path):
    from layerscope.engines.memory import text_cost

    long_text = WORDS * (POSITIONS // 9 - 2)  # about 2,000 tokens: 8 budgets of 256
    short = _extract_peak(long_export, ["a cat", "the dog runs"], tmp_path / "short", 256)
    few = _extract_peak(long_export, [f"{i} {long_text}" for i in range(3)], tmp_path / "few", 256)
    many = _extract_peak(long_export, [f"{i} {long_text}" for i in range(12)], tmp_path / "many", 256)
    # 4 heads, 32 wide; a mean extraction of every layer on ort holds every layer (its in-graph pooling stacks them)
    floor = text_cost(POSITIONS, hidden_size=32, heads=4, depth=2, layer_at_a_time=False).bytes
    # a run of such texts grows by their activations (ONNX Runtime's arena settles after a few texts) ...
    assert floor / 2 < many - short < 3 * floor, ((many - short) / MiB, floor / MiB)
    # ... and no further with the corpus: twelve texts in one batch would hold twelve times the attention
    assert many - few < floor / 2, ((many - few) / MiB, floor / MiB)
