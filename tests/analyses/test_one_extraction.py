"""Each text set passes through a model once per (model, engine, settings): every pooling comes from that pass,
and the analyses that follow read the cached vectors instead of running the model again."""

from __future__ import annotations

from pathlib import Path

import pytest

from layerscope.analyses.base import RunRequest, run_analysis

WORDS = "the a cat dog man woman child plays runs sits reads on in park house guitar book food river".split()


def _pairs_file(path: Path, n: int, seed: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        a = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 8))))
        b = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 8))))
        lines.append(f"g\tf\t2020\t{i:04d}\t{[0.4, 4.6][i % 2]}\t{a}\t{b}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def splits(tmp_path) -> dict[str, Path]:
    return {name: _pairs_file(tmp_path / f"{name}.tsv", n, seed)
            for name, n, seed in (("test", 12, 1), ("train", 16, 2), ("dev", 8, 3))}


@pytest.fixture()
def passes(monkeypatch, tmp_path) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Every pass of texts through a model that an analysis asks for: (how, texts, poolings)."""
    import layerscope.extraction.pipeline as pipeline

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    seen: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
    real_extract, real_embed = pipeline.extract, pipeline.embed

    def extract(model, source, out, **kw):
        seen.append(("extract", tuple(source), tuple(kw["poolings"])))
        return real_extract(model, source, out, **kw)

    def embed(model, texts, **kw):
        seen.append(("embed", tuple(texts), tuple(kw["poolings"])))
        return real_embed(model, texts, **kw)

    monkeypatch.setattr(pipeline, "extract", extract)
    monkeypatch.setattr(pipeline, "embed", embed)
    return seen


def _sts_probe(model, splits, out, **kw) -> RunRequest:
    return RunRequest(models=[str(model)], engine="torch", layers="all", out=out, seed=0, poolings=["mean", "cls"],
                      data=str(splits["test"]), **kw,
                      options={"n_boot": 0, "probe": True, "train": str(splits["train"]), "dev": str(splits["dev"]),
                            "probe_kind": "cosine-mlp", "probe_epochs": 2})


def _texts(path: Path) -> set[str]:
    return {t for line in path.read_text().splitlines() for t in line.split("\t")[5:7]}


def test_sts_probe_extracts_each_split_once_and_pooling_reuses_it(tiny_model, splits, passes, tmp_path):
    model = tiny_model("bert")
    run_analysis("sts", _sts_probe(model, splits, tmp_path / "sts"))
    assert [how for how, _, _ in passes] == ["extract"] * 3  # test, train, dev: one pass each
    assert sorted(map(set, (texts for _, texts, _ in passes)), key=len) == \
        sorted(map(_texts, splits.values()), key=len)
    for _, _, poolings in passes:  # every pooling of a BERT (it has no pooled output of its own: no eos)
        assert set(poolings) == {"mean", "cls", "last", "max", "mean-nobos"}

    before = len(passes)
    _, res = run_analysis("pooling", RunRequest(models=[str(model)], engine="torch", out=tmp_path / "pooling",
                                                seed=0, data=str(splits["test"]), options={"n_boot": 0}))
    assert len(passes) == before  # the test split's vectors come from the store sts made
    assert next(iter(res["per_model"].values()))["tables"]

    run_analysis("sts", _sts_probe(model, splits, tmp_path / "sts-batch", batch_tokens=64))
    assert len(passes) == before + 3  # another batch size is another extraction setting: not reused


def test_without_the_cache_each_split_still_passes_once(tiny_model, splits, passes, tmp_path):
    run_analysis("sts", _sts_probe(tiny_model("bert"), splits, tmp_path / "sts", cache=False))
    assert [how for how, _, _ in passes] == ["embed"] * 3
    assert all(set(poolings) == {"mean", "cls"} for _, _, poolings in passes)
