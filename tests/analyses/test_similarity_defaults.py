"""similarity's default texts are one language; every figure names its data and pooling; one colour scale
for all the heat maps of a run (PNG and report.html alike)."""

from __future__ import annotations

import re

import pytest

from figures import capture
from layerscope.analyses.base import Context, RunRequest, run_analysis

CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _ctx(models, out, **options):
    return RunRequest(models=[str(m) for m in models], engine="torch", layers="all", out=out, seed=0, cache=False,
                      options={"n": 12, "knn": 3, "indices": "all", **options})


def test_default_texts_are_one_language(tiny_model, tmp_path):
    from layerscope.analyses.similarity import Similarity

    data = Similarity().prepare(Context.asked(Similarity, _ctx([tiny_model("bert")], tmp_path / "x")))
    assert len(data["texts"]) == 12
    assert not any(CJK.search(t) for t in data["texts"]), data["texts"][:3]  # English only
    zh = Similarity().prepare(Context.asked(Similarity, _ctx([tiny_model("bert")], tmp_path / "y", language="zh")))
    assert all(CJK.search(t) for t in zh["texts"])
    both = Similarity().prepare(Context.asked(Similarity, _ctx([tiny_model("bert")], tmp_path / "z",
                                                                language="both")))
    assert len(both["texts"]) == 24 and "Chinese and English" in both["origin"]
    assert "English" in data["origin"] and "Chinese" not in data["origin"]


def test_every_title_names_data_and_pooling_and_one_scale_serves_all(tiny_model, tmp_path, monkeypatch):
    shown = capture(monkeypatch)
    a, b = tiny_model("bert"), tiny_model("roberta")
    out = tmp_path / "two"
    _, results = run_analysis("similarity", _ctx([a, b], out))
    heat = {name: s for name, s in shown.items() if name.endswith(".png")}
    assert {"linear_cka_0.png", "unbiased_cka_0.png", "mutual_knn_0.png", "cross_linear_cka.png",
            "cross_unbiased_cka.png", "cross_mutual_knn.png"} <= set(heat)
    for name, s in heat.items():
        assert "generated English (12 texts), mean pooling" in s.title(), (name, s.title())
    # one colour scale for every heat map of a score in [0, 1] (CKA, k-NN, every calibrated score); the raw
    # SVCCA, PWCCA, Procrustes distance (0..2) and RSA (-1..1) maps keep their own
    own = re.compile(r"(cross_)?(svcca|pwcca|procrustes|rsa)(_\d+)?\.png$")
    assert {"svcca_0.png", "rsa_calibrated_0.png", "cross_procrustes.png", "cross_pwcca_calibrated.png"} <= set(heat)
    clims = {s.clims[0] for name, s in heat.items() if not own.match(name)}
    assert len(clims) == 1, clims
    low, high = clims.pop()
    values = [v for fig in results["per_model"].values() for key in ("linear_cka", "unbiased_cka", "mutual_knn")
              for row in fig[key] for v in row if v is not None]
    assert low == min(0.0, min(values)) and high == max(1.0, max(values))
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("generated English (12 texts), mean pooling") >= 6
    zmins = set(re.findall(r'"zmin":\s*(-?[0-9.e-]+)', page))
    zmaxs = set(re.findall(r'"zmax":\s*(-?[0-9.e-]+)', page))
    assert len(zmins) == 1 and float(zmins.pop()) == pytest.approx(low)
    assert len(zmaxs) == 1 and float(zmaxs.pop()) == pytest.approx(high)
