"""Figures for decoders use the decoder's own pooling: default poolings, headlines and probes follow the family."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _pairs(tmp_path, n=24):
    rng = np.random.default_rng(3)
    words = "the a cat dog man woman plays runs sits reads on in park house guitar book river".split()
    lines = ["sentence1\tsentence2\tscore"]
    for i in range(n):
        a = " ".join(rng.choice(words, size=5))
        b = a if i % 2 == 0 else " ".join(rng.choice(words, size=5))
        lines.append(f"{a}\t{b}\t{4.0 if i % 2 == 0 else float(rng.integers(0, 3))}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _ctx(model, tmp_path, name, **kw):
    base = dict(models=[str(model)], engine="torch", layers="all", out=tmp_path / name, seed=0, cache=False)
    base.update(kw)
    return RunRequest(**base)


def _poolings(results):
    (fig,) = results["per_model"].values()
    return list(dict.fromkeys(r["pooling"] for r in fig["tables"]["layers"]))


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_sts_and_compositionality_default_to_the_decoders_last_and_mean(family, tiny_model, tmp_path):
    model = tiny_model(family)
    _, sts = run_analysis("sts", _ctx(model, tmp_path, "sts", data=str(_pairs(tmp_path)), options={"n_boot": 0}))
    assert _poolings(sts) == ["last", "mean"]
    _, comp = run_analysis("compositionality", _ctx(model, tmp_path, "comp"))
    assert _poolings(comp) == ["last", "mean"]
    _, asked = run_analysis("compositionality", _ctx(model, tmp_path, "asked", poolings=["cls", "max"]))
    assert _poolings(asked) == ["cls", "max"]  # what was asked for is kept


def test_encoders_keep_the_analysis_defaults_and_clip_gets_eos(tiny_model, tmp_path):
    _, bert = run_analysis("compositionality", _ctx(tiny_model("bert"), tmp_path, "bert"))
    assert _poolings(bert) == ["mean", "cls"]
    _, clip = run_analysis("compositionality", _ctx(tiny_model("clip-text"), tmp_path, "clip"))
    assert [p for p in _poolings(clip) if p != "own"] == ["eos"]  # "own": the checkpoint's pooler row


def test_the_cli_leaves_the_default_to_the_family(tiny_model, tmp_path, capsys):
    from cli_helpers import cli_output

    code, out, err = cli_output(["run", "compositionality", "--model", tiny_model("gpt2"), "--engine", "torch",
                                 "--no-cache", "--out", tmp_path / "r"], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert _poolings(results) == ["last", "mean"]


def test_alignment_headline_follows_the_family_and_every_pooling_is_summed_up(tiny_model, tmp_path):
    _, res = run_analysis("alignment", _ctx(tiny_model("gpt2"), tmp_path, "a", options={"n": 12, "permutations": 20,
                                                                                         "examples": 0}))
    (fig,) = res["per_model"].values()
    s = fig["summary"]
    assert s["pooling"] == "last"  # the decoder's own, not mean
    last_rows = [r for r in fig["tables"]["alignment_layers"] if r["pooling"] == "last"]
    assert s["z"] == last_rows[-1]["z"] and s["layer"] == last_rows[-1]["layer"]
    assert set(s["by_pooling"]) == {"last", "mean", "mean-nobos"}
    mean_rows = [r for r in fig["tables"]["alignment_layers"] if r["pooling"] == "mean"]
    assert s["by_pooling"]["mean"]["z"] == mean_rows[-1]["z"]
    _, enc = run_analysis("alignment", _ctx(tiny_model("bert"), tmp_path, "b", options={"n": 12, "permutations": 20,
                                                                                        "examples": 0}))
    assert next(iter(enc["per_model"].values()))["summary"]["pooling"] == "mean"


def test_sts_probe_trains_on_every_pooling(tiny_model, tmp_path):
    pairs = _pairs(tmp_path, 40)
    train = tmp_path / "train.tsv"
    train.write_text(pairs.read_text())
    _, res = run_analysis("sts", _ctx(tiny_model("gpt2"), tmp_path, "p", data=str(pairs), options={
        "n_boot": 0, "probe": True, "train": str(train), "probe_kind": "cosine-mlp", "probe_epochs": 2}))
    (fig,) = res["per_model"].values()
    rows = fig["probe"]["rows"]
    assert fig["probe"]["poolings"] == ["last", "mean"]
    for p in ("last", "mean"):
        mine = [r for r in rows if r["pooling"] == p]
        assert any(r["kind"] == "probe" for r in mine) and any(r["kind"] == "layer" for r in mine)
        assert all(r["name"].startswith(f"{p}: ") for r in mine)
    # a layer baseline is that pooling's own figure on the test pairs
    table = {(r["pooling"], r["layer"]): r["spearman"] for r in fig["tables"]["layers"]}
    final = [r for r in rows if r["pooling"] == "mean" and r["name"].startswith("mean: final layer")]
    assert final and final[0]["spearman"] == pytest.approx(table["mean", final[0]["layer"]], abs=1e-9)


def test_raw_equal_to_layer0_is_said_where_both_are_shown(tiny_model, tmp_path):
    for family, said in (("qwen2", True), ("gpt2", False)):  # GPT-2 adds position embeddings at layer 0
        lines: list[str] = []

        class Say:
            def print(self, text, **kw):
                lines.append(str(text))

        _, res = run_analysis("compositionality", _ctx(tiny_model(family), tmp_path, family, console=Say()))
        noted = any("'raw' and layer 0 are the same vectors by construction" in line for line in lines)
        assert noted is said, (family, lines)
        rows = {(r["pooling"], r["layer"]): r for r in next(iter(res["per_model"].values()))["tables"]["layers"]}
        same = rows["mean", "raw"]["mean_diff"] == pytest.approx(rows["mean", "0"]["mean_diff"], abs=1e-6)
        assert same is said  # and the note is true

