"""run similarity's indices beyond CKA: each layer pair's figures equal the reference computations on the same
vectors (rsatoolbox for RSA, the metrics for the rest, which tests/metrics/test_representation.py holds to the
papers' definitions), calibrated against the run's own seeded permutations; token rows of two models are
checked to correspond before anything is computed."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _req(models, out, **options):
    return RunRequest(models=[str(m) for m in models], engine="torch", layers="0,1,2", out=out, seed=3, cache=False,
                      options={"n": 14, "knn": 3, "permutations": 9, "indices": "all", **options})


def test_each_index_equals_its_reference_on_the_same_vectors(tiny_model, tmp_path):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    from layerscope.analyses.similarity import Similarity
    from layerscope.analyses.base import Context
    from layerscope.export.open import open_engine, resolve_model
    from layerscope.extraction.pipeline import embed
    from layerscope.metrics import representation as rep

    model = tiny_model("bert")
    out = tmp_path / "one"
    _, results = run_analysis("similarity", _req([model], out))
    fig = next(iter(results["per_model"].values()))
    texts = Similarity().prepare(Context.asked(Similarity, _req([model], out)))["texts"]
    handle = resolve_model(str(model))
    engine = open_engine(handle, "torch")
    try:
        vecs = embed(handle, texts, engine=engine, layers=["0", "1", "2"], poolings=["mean"])
    finally:
        engine.close()
    x = {la: np.asarray(vecs["mean", la], np.float64) for la in ("0", "1", "2")}
    perms = rep.permutations(len(texts), 9, seed=3)
    for i, la in enumerate(("0", "1", "2")):
        for j, lb in enumerate(("0", "1", "2")):
            if j < i:  # one model's matrix: the upper triangle computed (rows permuted on the column's side)
                for name in ("svcca", "pwcca", "rsa", "procrustes", "svcca_calibrated", "rsa_p"):
                    assert fig[name][i][j] == fig[name][j][i]
                continue
            a, b = rep.prepare(x[la]), rep.prepare(x[lb])
            for name in ("svcca", "pwcca", "rsa"):
                want = rep.SCORES[name](a, b)
                assert fig[name][i][j] == pytest.approx(want, abs=1e-5), (name, la, lb)
                cal = rep.calibrate(want, [rep.SCORES[name](a, b, p) for p in perms])
                assert fig[f"{name}_calibrated"][i][j] == pytest.approx(cal.calibrated, abs=1e-4)
                assert fig[f"{name}_p"][i][j] == pytest.approx(cal.p_value)
            assert fig["procrustes"][i][j] == pytest.approx(rep.procrustes_distance(a, b), abs=1e-5)
            rdms = [rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(x[k]), method="correlation") for k in (la, lb)]
            ref = float(rsatoolbox.rdm.compare(rdms[0], rdms[1], method="spearman")[0, 0])
            assert fig["rsa"][i][j] == pytest.approx(ref, abs=1e-5)
            assert fig["linear_cka_calibrated"][i][j] is not None
    # a layer against itself is 1 on every similarity and beats every permutation
    assert fig["svcca"][1][1] == pytest.approx(1.0) and fig["svcca_p"][1][1] == pytest.approx(1 / 10)
    assert {r["index"] for r in fig["best_calibrated"]} >= {"SVCCA", "PWCCA", "RSA", "linear CKA"}
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "SVCCA, calibrated between layers" in page and "row-shuffled null" in page


def test_token_rows_of_two_tokenizers_are_refused_in_one_line(tiny_model, tmp_path):
    with pytest.raises(InputError, match="into different tokens"):
        run_analysis("similarity", _req([tiny_model("bert"), tiny_model("roberta")], tmp_path / "tok", tokens=True,
                                        indices="none"))


def test_a_mistyped_index_is_one_line_before_work(tiny_model, tmp_path):
    with pytest.raises(InputError, match="did you mean 'svcca'"):
        run_analysis("similarity", _req([tiny_model("bert")], tmp_path / "bad", indices="svca"))
    assert not (tmp_path / "bad").exists()
