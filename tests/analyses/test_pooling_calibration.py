"""The pooling analysis: int8 ranges never come from the vectors they encode; retrieval finds only real matches."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _pairs(tmp_path):
    rng = np.random.default_rng(5)
    words = "the a cat dog man woman plays runs sits reads on in park house guitar book river".split()
    lines, scores = ["sentence1\tsentence2\tscore"], []
    for i in range(30):
        a = " ".join(rng.choice(words, size=6))
        b = " ".join(rng.choice(words, size=6)) if i % 3 else a + " today"
        score = 4.6 if i % 3 == 0 else float(i % 3)  # a third are paraphrases, the rest unrelated (1 or 2)
        lines.append(f"{a}\t{b}\t{score}")
        scores.append(score)
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path, np.array(scores)


def test_int8_is_calibrated_on_held_out_texts_and_retrieval_counts_only_real_matches(tiny_model, tmp_path,
                                                                                     monkeypatch):
    import layerscope.metrics.quantization as quantization

    calls = []
    real = quantization.int8_quantize

    def spy(x, *, calibration=None):
        calls.append((np.array(x), None if calibration is None else np.array(calibration)))
        return real(x, calibration=calibration)

    monkeypatch.setattr(quantization, "int8_quantize", spy)
    path, scores = _pairs(tmp_path)
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", data=str(path), out=tmp_path / "p", seed=0,
                     options={"n_boot": 0}, cache=False)
    _, res = run_analysis("pooling", ctx)
    assert calls
    for x, calibration in calls:
        assert calibration is not None
        encoded = {row.tobytes() for row in x}
        assert not encoded & {row.tobytes() for row in calibration}  # no vector calibrates its own range
    (fig,) = res["per_model"].values()
    ret = fig["summary"]["retrieval"]
    relevant = int((scores >= 4.0).sum())
    assert ret["relevant_score"] == 4.0 and ret["relevant_pairs"] == relevant
    assert ret["queries"] == 2 * relevant  # both directions, only the pairs scored 4 or more
    assert any("at least 4" in n for n in fig["summary"]["notes"])
