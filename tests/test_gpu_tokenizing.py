"""A GPU row's tokenizing and padding, on a machine without a GPU: the tokenizer pool an engine on a GPU gets is
sized from the host's cores (checked by hand and through the bench worker's own row setup), its vectors and
batches equal the one thread's, and a row's padding figures (tokens run, their share, FLOPs) against hand-worked
values. The last test runs on a GPU only."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from layerscope.model import tokenize_pool
from layerscope.model.tokenize_pool import processes_for_gpu

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought apples", "two dogs near the lake", "embedding models turn sentences into vectors",
         "the cat sat", "Water boils at 100 degrees Celsius at sea level.", "ok"] * 3


@pytest.mark.parametrize("cores,want", [(16, 14), (8, 6), (4, 2), (3, 1), (2, 1), (1, 1), (64, 16)])
def test_gpu_pool_size_from_the_host_cores(cores, want):
    got, why = processes_for_gpu(cores)
    assert got == want
    assert (why is None) == (want == 1)
    if why:  # all but the two cores left to the engine's threads, at most 16
        assert why.startswith(f"{want} tokenizer processes") and f"{cores} host cores" in why


def test_an_engine_on_a_gpu_is_sized_from_cores_a_cpu_engine_from_records(monkeypatch, tmp_path):
    from layerscope.extraction.batching import tokenizer_processes

    monkeypatch.setattr(tokenize_pool, "host_cores", lambda: 9)
    manifest = SimpleNamespace(source=SimpleNamespace(weights_sha256="w" * 64))
    for device in ("cuda", "cuda:1"):
        gpu = SimpleNamespace(info=SimpleNamespace(device=device), manifest=manifest, name="torch")
        assert tokenizer_processes(gpu)[0] == 7
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path))  # no record on this CPU: the thread
    cpu = SimpleNamespace(info=SimpleNamespace(device="cpu"), manifest=manifest, name="ort")
    assert tokenizer_processes(cpu) == (1, None)


def _job(export_dir, tmp_path):
    return {"name": "ort", "kind": "engine", "row_kind": "engine", "engine": "ort", "variant": None, "options": {},
            "export_dir": str(export_dir), "layers": ["0", "1", "2"], "pooling": "mean", "batch_tokens": 24,
            "max_batch": 4, "max_length": None, "out_dir": str(tmp_path)}


def test_the_bench_rows_tokenizer_setup_takes_its_pool_from_the_host_cores(bert_export, monkeypatch, tmp_path):
    """The bench worker's row setup, on an engine taken for a GPU one on a host of 4 cores: a pool of 2 processes,
    made once and kept across passes, whose vectors, batch shapes and split equal the one thread's."""
    from layerscope.bench import worker
    from layerscope.extraction import batching

    thread = worker._engine_row(_job(bert_export, tmp_path))
    want = thread.encode(TEXTS)
    want_shapes = list(thread.batch_shapes)
    assert thread.info["tokenizer_processes"] == 1
    thread.close()

    monkeypatch.setattr(batching, "on_gpu", lambda eng: True)
    monkeypatch.setattr(tokenize_pool, "host_cores", lambda: 4)
    row = worker._engine_row(_job(bert_export, tmp_path))
    try:
        assert row.info["tokenizer_processes"] == 2
        for _ in range(2):  # the same pool serves every pass
            np.testing.assert_array_equal(row.encode(TEXTS), want)
        assert row.batch_shapes == want_shapes and len(want_shapes) > 3
        # the batches as run: each text once, no batch over the 24-token budget
        assert sum(b for b, _ in want_shapes) == len(TEXTS) and all(b * w <= 24 or b == 1 for b, w in want_shapes)
        parts = row.split(TEXTS, 1.0)
        assert set(parts) == {"tokenize_s", "engine_s", "pool_copy_s", "write_s"} and parts["engine_s"] > 0
    finally:
        row.close()


def test_padding_figures_by_hand():
    from layerscope.bench.isolated import padding_figures
    from layerscope.bench.isolated_report import _padding

    # two batches: 2 texts padded to 5 tokens, 3 texts padded to 4: 22 tokens run for 18 real ones
    shapes = {"layers": 1, "hidden": 2, "intermediate": 4}
    got = padding_figures([[2, 5], [3, 4]], 18, 2.0, shapes, peak_gflops=1e-6)
    assert got["tokens_padded"] == 22 and got["padding_share"] == pytest.approx(4 / 22)
    assert got["real_tokens_per_s"] == 9.0 and got["padded_tokens_per_s"] == 11.0
    # per text of n tokens, 1 layer: 2 n (4 h^2 + 2 h i) + 4 n^2 h = 2n (16 + 16) + 8 n^2 = 64 n + 8 n^2
    flops = 2 * (64 * 5 + 8 * 25) + 3 * (64 * 4 + 8 * 16)  # 1040 + 1152
    assert got["padded_gflops_per_s"] == pytest.approx(flops / 2.0 / 1e9)
    assert got["peak_fraction_padded"] == pytest.approx(flops / 2.0 / 1e9 / 1e-6)
    assert _padding(got) == "9 / 11 (18.2%)" and _padding({}) == "-"


def test_a_row_over_the_first_texts_counts_their_tokens_and_flops():
    """hf-eager under --reference-texts runs the first texts only: its tokens, padding and FLOPs are theirs."""
    from layerscope.bench.isolated import _finish

    shapes = {"layers": 1, "hidden": 2, "intermediate": 4}
    lengths = np.array([3, 4, 5, 6])
    corpus = float(sum(64 * n + 8 * n * n for n in lengths))  # 64 n + 8 n^2 per text (see above)
    peak = {"gflops": 1e-6, "text": "by hand"}
    first = {"engine": "hf-eager", "available": True, "layers": [], "best_s": 1.0, "device": "cpu", "texts": 2,
             "batch_shapes": [[2, 4]]}
    whole = {"engine": "ort", "available": True, "layers": [], "best_s": 1.0, "device": "cpu", "texts": 4,
             "batch_shapes": [[2, 4], [2, 6]]}
    for r in (first, whole):
        _finish(r, None, [], None, corpus, peak, lengths=lengths, shapes=shapes)
    assert first["tokens_real"] == 7 and first["tokens_padded"] == 8 and "batch_shapes" not in first
    assert first["gflops_per_s"] == pytest.approx((64 * 3 + 72 + 64 * 4 + 128) / 1e9)
    assert whole["tokens_real"] == 18 and whole["tokens_padded"] == 20
    assert whole["gflops_per_s"] == pytest.approx(corpus / 1e9)
    assert whole["padded_gflops_per_s"] == pytest.approx(2 * (64 * 4 + 128 + 64 * 6 + 288) / 1e9)


@pytest.mark.gpu
def test_a_torch_row_on_the_gpu_tokenizes_in_a_pool_sized_from_the_host(bert_export, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from layerscope.bench import worker
    from layerscope.model.tokenize_pool import host_cores

    cpu = worker._engine_row(dict(_job(bert_export, tmp_path), engine="torch", options={"device": "cpu"}))
    want = cpu.encode(TEXTS)
    cpu.close()
    row = worker._engine_row(dict(_job(bert_export, tmp_path), engine="torch", options={"device": "cuda"}))
    try:
        assert row.info["device"].startswith("cuda")
        assert row.info["tokenizer_processes"] == processes_for_gpu(host_cores())[0]
        np.testing.assert_allclose(row.encode(TEXTS), want, atol=5e-3)
    finally:
        row.close()
