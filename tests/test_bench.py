"""The bench harness computes consistent numbers (no test asserts a speed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def export_dir(bert_export):
    return bert_export


def test_synthetic_corpus_is_reproducible_and_mixed():
    from layerscope.data.synthetic import iter_synthetic, synthetic_texts
    from layerscope.errors import InputError

    a = synthetic_texts(500, seed=3)
    assert a == synthetic_texts(500, seed=3)
    assert a != synthetic_texts(500, seed=4)
    assert list(iter_synthetic(5000, seed=3))[:500] == a  # a prefix does not depend on n
    words = np.array([len(t.split()) for t in a])
    assert words.min() >= 3 and words.max() > 45 and np.median(words) < 20
    with pytest.raises(InputError):
        synthetic_texts(0)
    with pytest.raises(InputError, match="profile"):
        synthetic_texts(5, profile="huge")


def test_parse_engines_rejects_unknown():
    from layerscope.bench.runner import parse_engines
    from layerscope.errors import InputError

    assert parse_engines("ort, ort-int8,hf-eager,ort") == ["ort", "ort-int8"]
    with pytest.raises(InputError, match="did you mean 'ort-int8'"):
        parse_engines("ort-int9")


def test_tiny_bench_run(export_dir, tmp_path):
    from layerscope.data.synthetic import synthetic_texts
    from layerscope.bench.report import markdown_table, write_results
    from layerscope.bench.config import BenchConfig
    from layerscope.bench.runner import run_bench

    sts = tmp_path / "sts.csv"
    rows = [("main-captions", "x", "2012", f"{i:04d}", f"{s:.1f}", a, b) for i, (s, a, b) in enumerate([
        (5.0, "a dog plays in the snow", "a dog plays in snow"),
        (0.5, "the market sells apples", "a man plays a guitar"),
        (3.0, "the weather is sunny", "today the weather is sunny and warm"),
        (1.0, "two dogs near the lake", "embedding models turn sentences into vectors"),
        (4.2, "she bought apples", "she bought some apples"),
    ])]
    sts.write_bytes(("\r\n".join("\t".join(r) for r in rows) + "\r\n").encode())
    cfg = BenchConfig(model=str(export_dir), engines=["ort", "ort-tokens", "ort-bf16"],
                      texts=synthetic_texts(40, seed=1), corpus="synthetic", batch_tokens=512,
                      hf_batch_size=8, sts=str(sts))
    bench = run_bench(cfg)
    by = {r["engine"]: r for r in bench["results"]}
    assert set(by) == {"hf-eager", "sentence-transformers", "ort", "ort-tokens", "ort-bf16"}
    # engines that cannot run are listed with their reason
    assert by["ort-bf16"]["available"] is False and "bf16" in by["ort-bf16"]["reason"]
    assert by["sentence-transformers"]["available"] is False and by["sentence-transformers"]["reason"]
    layers = bench["settings"]["layers"]
    assert layers == ["0", "1", "2"]
    for name in ("hf-eager", "ort", "ort-tokens"):
        r = by[name]
        for key in ("texts_per_s", "tokens_per_s", "latency_p50_ms", "latency_p95_ms", "peak_rss_mib",
                    "setup_s", "cpu_s", "speedup_vs_hf_eager"):
            assert r[key] is not None and r[key] >= 0, (name, key)
        assert r["texts"] == 40
        assert math.isclose(r["texts_per_s"], r["texts"] / r["seconds"], rel_tol=1e-3)
        assert math.isclose(r["speedup_vs_hf_eager"], r["texts_per_s"] / by["hf-eager"]["texts_per_s"],
                            rel_tol=1e-9)
        assert r["latency_p50_ms"] <= r["latency_p95_ms"]
        assert r["peak_gpu_mib"] is None  # CPU engine: no GPU figure, not a zero
        assert set(r["accuracy"]) == set(layers)
        assert set(r["sts_spearman"]) == set(layers)
        for layer in layers:
            assert math.isclose(r["sts_spearman_delta"][layer],
                                r["sts_spearman"][layer] - by["hf-eager"]["sts_spearman"][layer], abs_tol=1e-9)
    assert by["hf-eager"]["speedup_vs_hf_eager"] == 1.0
    assert by["hf-eager"]["batches"] == 5  # 40 texts in batches of 8, corpus order
    # the fp32 engines match the fp32 torch reference
    for name in ("ort", "ort-tokens"):
        for layer, acc in by[name]["accuracy"].items():
            assert acc["max_abs"] < 1e-4 and acc["min_cos"] > 0.99999, (name, layer)
    assert by["ort"]["tokens"] == by["hf-eager"]["tokens"]  # same texts, same unpadded token count

    paths = write_results(bench, tmp_path / "out", plot=True)
    saved = json.loads(paths["json"].read_text())
    assert saved["machine"]["logical_cores"] >= 1 and "versions" in saved["machine"]
    table = markdown_table(saved)
    assert "| ort |" in table and "| hf-eager |" in table and "`ort-bf16`" in table
    assert paths["plot"].stat().st_size > 1000
    assert paths["markdown"].read_text().count("\n|") >= 4


def test_sts_reader_errors(tmp_path):
    from layerscope.data.pairs import read_sts
    from layerscope.errors import InputError

    with pytest.raises(InputError, match="no such file"):
        read_sts(str(tmp_path / "missing.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("only\tthree\tcolumns\n")
    with pytest.raises(InputError, match=r"bad\.csv:1: 3 tab-separated columns"):
        read_sts(str(bad))
