"""The process-isolated bench: one process per row per round, alternating order, and every table field computed."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest


@pytest.fixture(scope="module")
def export_dir(bert_export):
    return bert_export


def test_peak_and_flops_from_shapes(tmp_path):
    from layerscope.bench.peak import corpus_flops, flops_per_cycle, machine_peak, model_shapes

    assert flops_per_cycle({"avx512f", "avx2", "fma"})[0] == 64
    assert flops_per_cycle({"avx2", "fma", "avx"})[0] == 32
    assert flops_per_cycle({"avx"})[0] == 16
    assert flops_per_cycle(set())[0] == 8
    # Zen 4 runs AVX-512 on two 256-bit FMA units; Zen 5 and Intel's AVX-512 server cores have 512-bit ones
    assert flops_per_cycle({"avx512f", "avx2", "fma"}, "AuthenticAMD", 25)[0] == 32
    assert flops_per_cycle({"avx512f", "avx2", "fma"}, "AuthenticAMD", 26)[0] == 64
    assert flops_per_cycle({"avx512f", "avx2", "fma"}, "GenuineIntel", 6)[0] == 64
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "cpu MHz\t\t: 2596.130\nflags\t\t: fpu avx avx2 fma avx512f avx512_bf16\n")
    assert machine_peak(str(zen4), cores=2)["flops_per_cycle"] == 32
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu MHz\t\t: 2500.000\nflags\t\t: fpu sse2 avx avx2 fma\n")
    peak = machine_peak(str(info), cores=3)
    if peak["clock_source"] == "cpu MHz in /proc/cpuinfo":  # no cpufreq on this machine: the file's clock
        assert peak["gflops"] == pytest.approx(3 * 2.5 * 32)
    else:
        assert peak["gflops"] == pytest.approx(3 * peak["ghz"] * 32, rel=1e-3)
    assert "32 fp32 FLOPs/cycle" in peak["text"]
    (tmp_path / "config.json").write_text('{"hidden_size": 4, "num_hidden_layers": 2, "intermediate_size": 8}')
    shapes = model_shapes(tmp_path)
    assert shapes == {"layers": 2, "hidden": 4, "intermediate": 8}
    # one text of 3 tokens: per layer 2*3*(4*16 + 2*32) matmul FLOPs + 4*9*4 attention FLOPs
    assert corpus_flops(shapes, np.array([3])) == 2 * (2 * 3 * (64 + 64) + 4 * 9 * 4)
    assert corpus_flops(shapes, np.array([3, 3])) == 2 * corpus_flops(shapes, np.array([3]))


def test_the_measured_peak_is_2n3_flops_over_the_fastest_product(tmp_path):
    """The GEMM rate from a clock that reads 1.0, 0.9, 0.5 and 0.7 s for four products: 2 n^3 FLOPs over the
    fastest (0.5 s); the peak a CPU row is a fraction of is that rate, the flag-derived one listed beside it."""
    from layerscope.bench.peak import cpu_peak, gemm_rate

    ticks = iter([0.0, 1.0, 10.0, 10.9, 20.0, 20.5, 30.0, 30.7])
    got = gemm_rate(n=64, repeats=4, clock=lambda: next(ticks))
    assert got["best_s"] == pytest.approx(0.5)
    assert got["gflops"] == pytest.approx(round(2 * 64 ** 3 / 0.5 / 1e9, 1))
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu MHz\t\t: 2500.000\nflags\t\t: fpu sse2 avx avx2 fma\n")
    fake = {"n": 1536, "repeats": 8, "best_s": 0.05, "gflops": 144.9}
    peak = cpu_peak(str(info), cores=3, measure=lambda: fake)
    assert peak["gflops"] == 144.9 and peak["measured"] == fake
    assert peak["derived"]["flops_per_cycle"] == 32
    assert "144.9 GFLOP/s" in peak["text"] and "32 fp32 FLOPs/cycle" in peak["text"]
    real = gemm_rate(n=128, repeats=2)  # the real product runs and gives a finite, positive rate
    assert 0 < real["gflops"] < math.inf


def test_accuracy_class_and_peer_names():
    from layerscope.bench.isolated import accuracy_class, parse_peers
    from layerscope.errors import InputError

    assert accuracy_class(0.99995) == ">= 0.9999"
    assert accuracy_class(0.99989) == ">= 0.999"
    assert accuracy_class(0.995) == ">= 0.99"
    assert accuracy_class(0.974) == "< 0.99"
    assert accuracy_class(None) == "-"
    assert parse_peers("none") == []
    assert "st-onnx-qint8" in parse_peers("all")
    with pytest.raises(InputError, match="did you mean 'st-onnx'"):
        parse_peers("st-onx")


def test_each_row_runs_in_its_own_process_rounds_alternate(export_dir, tmp_path):
    from layerscope.data.synthetic import synthetic_texts
    from layerscope.bench.isolated import IsolatedConfig, run_isolated
    from layerscope.bench.isolated_report import isolated_table
    from layerscope.bench.report import write_results

    engines = ["ort"]  # two rows x two rounds: four processes keep this test short
    texts = synthetic_texts(24, seed=3)
    cfg = IsolatedConfig(model=str(export_dir), engines=engines, texts=texts, corpus="synthetic",
                         peers=["st-torch", "st-onnx"], rounds=2, passes=2, batch_tokens=256, hf_batch_size=8)
    bench = run_isolated(cfg)
    by = {r["engine"]: r for r in bench["results"]}
    assert list(by) == ["hf-eager", *engines, "st-torch", "st-onnx"]
    # the tiny model is not a sentence-transformers model: the peers say so instead of running
    for peer in ("st-torch", "st-onnx"):
        assert by[peer]["available"] is False and by[peer]["reason"]
    rows = [by[n] for n in ["hf-eager", *engines]]
    pids = [p for r in rows for p in r["pids"]]
    assert len(pids) == 2 * len(rows) and len(set(pids)) == len(pids) and os.getpid() not in pids
    # round 1 in the given order, round 2 reversed
    first = [r["started"][0] for r in rows]
    second = [r["started"][1] for r in rows]
    assert first == sorted(first) and second == sorted(second, reverse=True)
    assert max(first) < min(second)
    peak = bench["machine"]["peak"]
    flops = bench["corpus"]["flops"]
    assert flops > 0 and bench["corpus"]["tokens_unpadded"] > len(texts)
    layers = bench["settings"]["layers"]
    for r in rows:
        assert r["rounds"] == 2 and r["passes"] == 4 and r["texts"] == len(texts)
        assert math.isclose(r["texts_per_s"], len(texts) / r["best_s"])
        assert r["median_texts_per_s"] <= r["texts_per_s"]
        assert len(r["round_best_texts_per_s"]) == 2 and max(r["round_best_texts_per_s"]) == r["texts_per_s"]
        assert r["rounds_agree"] == (max(r["round_best_texts_per_s"]) <= 1.1 * min(r["round_best_texts_per_s"]))
        assert set(r["accuracy"]) == set(layers) and r["layers"] == layers
        assert r["min_cos"] == min(a["min_cos"] for a in r["accuracy"].values())
        assert math.isclose(r["peak_fraction"], flops / r["best_s"] / 1e9 / peak["gflops"])
        assert set(r["split"]) == {"tokenize_s", "engine_s", "pool_copy_s", "write_s"}
        assert all(v >= 0 for v in r["split"].values()) and r["split"]["engine_s"] > 0
        assert math.isclose(r["x_hf_eager"], r["texts_per_s"] / by["hf-eager"]["texts_per_s"])
    for name in engines:  # fp32 engines against the fp32 torch loop
        assert by[name]["accuracy_class"] == ">= 0.9999", by[name]["min_cos"]
        assert by[name]["split"]["write_s"] > 0  # the layerscope rows write a store
    paths = write_results(bench, tmp_path / "out", plot=False)
    table = isolated_table(bench)
    assert paths["markdown"].read_text().endswith(table)
    assert f"= {peak['gflops']:.1f} GFLOP/s" in table
    for name in ["hf-eager", *engines]:
        assert f"| {name} | all |" in table
    assert "- `st-torch`:" in table


def test_a_failing_row_reports_its_reason(tmp_path):
    from layerscope.bench.isolated import _run_worker

    texts = tmp_path / "texts.json"
    texts.write_text('["a", "b"]')
    job = {"name": "ort", "kind": "engine", "row_kind": "engine", "engine": "ort", "variant": None,
           "export_dir": str(tmp_path / "missing"), "texts_file": str(texts), "out_dir": str(tmp_path / "o"),
           "layers": ["0"], "pooling": "mean", "passes": 1, "n_acc": 2, "max_batch": 8}
    res = _run_worker(job, tmp_path, 300)
    assert res["available"] is False and "missing" in res["reason"]


def test_gpu_peer_says_why_it_cannot_run_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    from layerscope.bench.peers import missing

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert missing("st-cuda-fp16") == "needs a CUDA GPU, and PyTorch sees none here"
    assert missing("st-torch") is None


def test_progress_counts_rows_over_every_round_and_its_estimate_on_a_fake_clock(export_dir, monkeypatch, caplog):
    """Catches: a count that starts again each round (round 2 at 1/N, or at N+1/N with skipped rows counted) and a
    time left computed from one round instead of the whole bench."""
    import logging
    from types import SimpleNamespace

    import layerscope.progress as progress
    from layerscope.bench import isolated

    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)  # a line after every row
    caplog.set_level(logging.INFO, logger="layerscope")

    def worker(job, work, timeout_s):
        now[0] += 10.0  # every row takes 10 s on the fake clock
        return {"engine": job["name"], "kind": job["row_kind"], "available": False, "reason": "not run in this test"}

    monkeypatch.setattr(isolated, "_run_worker", worker)
    said: list[str] = []
    cfg = isolated.IsolatedConfig(model=str(export_dir), engines=["ort"], texts=["a b c", "d e"], corpus="two",
                                  peers=["st-torch"], rounds=2, passes=1, progress=said.append)
    isolated.run_isolated(cfg)
    # hf-eager and ort run; st-torch is skipped (the tiny model is no sentence-transformers model): 2 rows x 2 rounds
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("bench")]
    assert [m.split(" process: ", 1)[1] for m in lines] == ["1/4 (25%), 0:00:10 elapsed, about 0:00:30 left",
                                                             "2/4 (50%), 0:00:20 elapsed, about 0:00:20 left",
                                                             "3/4 (75%), 0:00:30 elapsed, about 0:00:10 left",
                                                             "4/4 (100%), 0:00:40 elapsed"]
    assert {m.split(": ", 1)[0] for m in lines} == {"bench"}  # one count for the whole bench, not one per round
    assert lines[0].startswith("bench: 2 rows x 2 rounds, each row in its own process: ")
    rows = [m for m in said if m.startswith("round ")]
    assert rows == ["round 1/2: hf-eager in its own process (row 1 of 4)",
                    "round 1/2: ort in its own process (row 2 of 4)",
                    "round 2/2: ort in its own process (row 3 of 4)",
                    "round 2/2: hf-eager in its own process (row 4 of 4)"]


def test_a_sentence_transformers_row_is_held_to_the_checkpoints_own_embedding():
    """Catches: the isolated bench measuring a sentence-transformers row against the reference's pooled layer L
    where the checkpoint has a recipe (its own embedding: ModernBERT pools its final norm of layer L)."""
    from layerscope.bench.isolated import _finish

    rng = np.random.default_rng(0)
    layer_l = rng.normal(size=(1, 5, 8))  # the reference row's mean of hidden_states[L]
    own = rng.normal(size=(5, 8))  # the checkpoint's own embedding of the same texts
    own /= np.linalg.norm(own, axis=1, keepdims=True)
    ref = {"engine": "hf-eager", "kind": "baseline", "available": True, "layers": ["2"], "best_s": 1.0,
           "_vectors": layer_l, "_own": own}
    peer = {"engine": "st-torch", "kind": "peer", "available": True, "layers": ["2"], "best_s": 1.0,
            "_vectors": own[None] * 1.0}
    for r in (ref, peer):
        _finish(r, ref, ["2"], None, None, None)
    assert peer["accuracy"]["2"]["min_cos"] == pytest.approx(1.0) and peer["accuracy"]["2"]["max_abs"] == 0.0
    assert "own embedding" in peer["accuracy_reference"] and "_own" not in peer
    assert ref["accuracy"]["2"]["min_cos"] == pytest.approx(1.0)  # the reference's own row: its layer L
