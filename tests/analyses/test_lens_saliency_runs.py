"""``inspect run lens`` / ``inspect run saliency`` end to end on a tiny BERT, and every bad input.

The end-to-end runs are smoke tests (marked ``smoke``): they prove the commands complete and write their
outputs; the values are checked against independent computations in tests/decoding/."""

from __future__ import annotations

import json

import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

POS = ["what a lovely warm day in the sunny park today", "the people here are kind and the food is great",
       "we had a wonderful time and the music was lovely"]
NEG = ["what a cold grim day in the muddy park today", "the people here are rude and the food is awful",
       "we had a terrible time and the music was dreadful"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and far faster on a busy CPU
    yield
    torch.set_num_threads(before)


def _labeled(path, rows):
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def data(tmp_path):
    return _labeled(tmp_path / "d.jsonl", [(t, "pos") for t in POS] + [(t, "neg") for t in NEG])


def _ctx(tiny_model, tmp_path, **kw):
    options = kw.pop("options", {})
    return RunRequest(models=[str(tiny_model("bert"))], engine=kw.pop("engine", "torch"), out=tmp_path / "out",
                      poolings=["mean"], cache=False, options=options, **kw)


@pytest.mark.smoke
def test_saliency_probe_end_to_end(tiny_model, tmp_path, data):
    """Smoke test: the probe objective runs end to end and writes every file, with one curve value per
    k for every method. Its figures are checked in tests/decoding/test_saliency.py (decoded saliency and
    grad x input against hand computations, integrated gradients against completeness and captum, the
    hiding/revealing games and their curves by hand, the probe on a separable problem) and
    tests/decoding/test_saliency_analysis_values.py (the analysis's objective and reference figures)."""
    ctx = _ctx(tiny_model, tmp_path, data=data, layers="0,1,2",
               options={"k": 3, "ig_steps": 4, "random_draws": 2, "objective": "probe", "eval_fraction": 0.5,
                        "decode": "probs", "show": 5, "target": "predicted"})
    out, results = run_analysis("saliency", ctx)
    fig = next(iter(results["per_model"].values()))
    assert fig["head"]["kind"] == "mlm-head"
    curves = fig["curves"]
    for m in ("decoded@0", "decoded@1", "decoded@2", "grad-x-input", "integrated-gradients", "random"):
        assert len(curves[m]["hide_drop"]) == 3 and len(curves[m]["reveal_value"]) == 3
    assert fig["summary"]["n_explained"] == 4  # 2 per class held out
    for name in ("results.json", "report.md", "saliency.html", "saliency_methods.csv", "saliency_curves.csv"):
        assert (out / name).is_file()
    assert list(out.glob("hiding_decoded_*.png")) and list(out.glob("revealing_decoded_*.png"))
    page = (out / "saliency.html").read_text()
    assert "decoded@1" in page and "[MASK]" in page and "<style>" in page


@pytest.mark.smoke
def test_saliency_similarity_end_to_end(tiny_model, tmp_path, data):
    """Smoke test: the similarity objective runs end to end; its figures are checked in
    tests/decoding/test_saliency_analysis_values.py and tests/decoding/test_saliency.py."""
    ctx = _ctx(tiny_model, tmp_path, data=data, layers="1,2",
               options={"k": 2, "ig_steps": 2, "random_draws": 1, "objective": "similarity",
                        "reference": "a lovely day in the park", "decode": "logits", "eval_fraction": 0.5})
    _, results = run_analysis("saliency", ctx)
    fig = next(iter(results["per_model"].values()))
    assert fig["summary"]["objective"] == "similarity" and fig["summary"]["n_explained"] == 6
    assert -1.0 <= fig["summary"]["mean_full"] <= 1.0


@pytest.mark.smoke
def test_lens_end_to_end_torch(tiny_model, tmp_path):
    """Smoke test: the lens runs end to end and writes its table and plot. Its figures are checked in
    tests/decoding/test_lens_analysis_values.py (the table against a logit lens written out by hand) and
    tests/decoding/test_heads_lens.py (heads, ranks, top-k, the accumulator, the ONNX lens graph)."""
    texts = tmp_path / "t.txt"
    texts.write_text("the cat sat on the mat\nwater boils at sea level\n", encoding="utf-8")
    ctx = _ctx(tiny_model, tmp_path, data=str(texts), layers="all", options={"top_k": 3, "show": 1, "batch": 1})
    out, results = run_analysis("lens", ctx)
    fig = next(iter(results["per_model"].values()))
    assert [r["layer"] for r in fig["tables"]["lens_by_layer"]] == ["0", "1", "2"]
    assert fig["tables"]["lens_by_layer"][-1]["top1_agrees_with_last"] == 1.0
    assert len(fig["texts"]) == 1 and len(fig["texts"][0]["layers"]["0"]["top"][0]) == 3
    assert (out / "lens_by_layer.csv").is_file() and (out / "lens_rank.png").is_file()


@pytest.mark.parametrize("rows, options, match", [
    ([("a b c d", "pos"), ("e f g h", "pos")], {}, "every text has the label 'pos'"),
    ([("a b c d", "pos"), ("e f g h", "pos"), ("i j k l", "neg")], {}, "'neg' have a single text"),
    (None, {"target": "neutral"}, "'neutral' is not a label of the probe"),
    (None, {"objective": "similarity", "reference": "   "}, "--reference is empty"),
    (None, {"objective": "similarity"}, "needs --reference"),
    (None, {"objective": "nonsense"}, "--objective must be"),
])
def test_saliency_bad_input_in_prepare(tiny_model, tmp_path, data, rows, options, match):
    path = _labeled(tmp_path / "bad.jsonl", rows) if rows else data
    ctx = _ctx(tiny_model, tmp_path, data=path, options={"k": 2, "objective": "probe", "target": "predicted",
                                                         "eval_fraction": 0.5, "ig_steps": 2,
                                                         "random_draws": 1, "decode": "probs", **options})
    with pytest.raises(InputError, match=match):
        run_analysis("saliency", ctx)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layers, options, match", [
    ("0,1", {"objective": "similarity", "reference": "\u200b"}, "tokenizes to nothing"),
    ("0,1", {"k": 50}, "--k 50 is larger than text"),
    ("7", {}, "layer 7 is out of range"),
])
def test_saliency_bad_input_at_compute(tiny_model, tmp_path, data, layers, options, match):
    opts = {"k": 2, "objective": "probe", "target": "predicted", "eval_fraction": 0.5, "ig_steps": 2,
            "random_draws": 1, "decode": "probs", **options}
    with pytest.raises(InputError, match=match):
        run_analysis("saliency", _ctx(tiny_model, tmp_path, data=data, layers=layers, options=opts))
    assert not (tmp_path / "out").exists()


def test_saliency_refuses_other_engines(tiny_model, tmp_path, data):
    with pytest.raises(InputError, match="runs on the torch engine only"):
        run_analysis("saliency", _ctx(tiny_model, tmp_path, data=data, engine="ort", options={"k": 2}))


def test_saliency_txt_file_has_no_labels(tiny_model, tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("a b c\n", encoding="utf-8")
    with pytest.raises(InputError, match="a labeled file is needed"):
        run_analysis("saliency", _ctx(tiny_model, tmp_path, data=str(p), options={"k": 2, "objective": "probe",
                                                                                  "eval_fraction": 0.5}))


def test_saliency_help_names_the_integrated_gradients_baseline(capsys):
    from cli_helpers import run_cli

    import re

    code, text = run_cli(["run", "saliency", "--help"], capsys)
    flat = " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())  # without the help panel's box lines
    assert code == 0, text
    assert "from a mask baseline" in flat and "not captum's default all-zero embeddings" in flat, text
