"""What makes two runs, or two cached vector sets, the same: each test names one setting that must count
(the model's precision variant, the batch size, options at their defaults, the engine's variant) or the
rule for reusing a cached store (it holds every asked pooling, not just some)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from layerscope.analyses.spec import ModelSpec, RunSpec


def _spec(variant=None, batch_tokens=None) -> RunSpec:
    model = ModelSpec(given="m", key="weights-1", folder="m", revision="abc", layers=("1",), poolings=("mean",),
                      engine="ort", variant=variant)
    return RunSpec.make("sts", [model], engine="ort", layers="-1", poolings=["mean"], max_length=None,
                        batch_tokens=batch_tokens, engine_options=None, data=None, seed=0, options={"n_boot": 0})


def test_the_models_variant_is_part_of_the_run():
    """ort running the int8 graph gives other figures than ort's fp32 graph: another run, another folder."""
    fp32, int8 = _spec(), _spec(variant="int8")
    assert fp32.identity()["model.variant"] is None and int8.identity()["model.variant"] == "int8"
    assert fp32.hash != int8.hash
    assert "model.variant None -> 'int8'" in int8.differences(fp32.identity())


def test_batch_tokens_is_part_of_the_run():
    """Batches of another size pad differently (other float sums): another run."""
    a, b = _spec(batch_tokens=None), _spec(batch_tokens=2048)
    assert b.identity()["batch_tokens"] == 2048 and a.identity()["batch_tokens"] is None
    assert a.hash != b.hash
    assert b.differences(a.identity()) == ["batch_tokens None -> 2048"]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path


def _pairs(path: Path) -> Path:
    rows = ["sentence1\tsentence2\tscore", "a cat sits\ta cat sat\t4.5", "dogs run fast\tthe sky is blue\t0.5",
            "a man plays guitar\ta man plays a guitar\t4.8", "rain falls\tkids play football\t0.2",
            "the market opens\tthe shop opens\t3.0", "birds fly\ta plane takes off\t1.5"]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_runs_options_are_recorded_with_every_default_filled_in(home, tiny_model):
    """A library caller naming one option: the run's identity holds every declared option at its default
    (so an option named at its default is the same run, and a later change of a default is another run)."""
    from layerscope.analyses.base import RunRequest, run_analysis

    data = _pairs(home / "pairs.tsv")
    ctx = dict(models=[str(tiny_model("bert"))], engine="torch", layers="-1", poolings=["mean"], data=str(data),
               cache=False)
    first = run_analysis("sts", RunRequest(options={"n_boot": 0}, **ctx))
    doc = json.loads((Path(first.out) / "results.json").read_text())
    # sts's declared defaults, by hand
    expected = {"n_boot": 0, "probe": False, "train": None, "dev": None, "probe_kind": "all", "probe_loss": "mse",
                "pretrain": False}
    for name, value in expected.items():
        assert doc["identity"][f"options.{name}"] == value, name
        assert doc["settings"]["options"][name] == value, name
    again = run_analysis("sts", RunRequest(options={"n_boot": 0, "probe": False, "probe_kind": "all"}, **ctx))
    assert again.out == first.out and again.reused  # the defaults named: the same run, reused


@pytest.fixture()
def fake_run(tiny_model):
    import fake_engine
    from layerscope.export.open import open_engine
    from layerscope.model.handle import ModelHandle

    fake_engine.register_fake()
    handle = ModelHandle.resolve(str(tiny_model("bert")))
    yield SimpleNamespace(handle=handle, engine=open_engine(handle, "fake"))
    fake_engine.unregister_fake()


def test_the_vector_cache_key_holds_the_engines_variant(fake_run):
    """int8 vectors must never be reused for an fp32 run of the same engine and model."""
    from layerscope.analyses.cache import cache_key

    texts = ["a cat sits", "dogs run"]
    fp32 = cache_key(fake_run, texts)
    fake_run.engine.variant = "int8"
    int8 = cache_key(fake_run, texts)
    fake_run.engine.variant = None
    assert fp32 != int8 and cache_key(fake_run, texts) == fp32


def test_vectors_made_with_the_models_own_code_never_serve_a_run_without_it(home, tiny_model):
    """The same model, engine and texts, read once with --trust-remote-code and once without: two cache entries,
    each reused only by a run like its own. Catches: the cache key without the flag, or reading it from a name
    the model handle does not have (every run would count as one without the model's code)."""
    import fake_engine
    from layerscope.analyses.cache import cache_key, cached_vectors
    from layerscope.export.open import open_engine
    from layerscope.model.handle import ModelHandle

    fake_engine.register_fake()
    try:
        runs = {}
        for flag in (True, False):
            handle = ModelHandle.resolve(str(tiny_model("bert")), trust_remote_code=flag)
            assert handle.trust_remote_code is flag
            runs[flag] = SimpleNamespace(handle=handle, engine=open_engine(handle, "fake"))
        texts = ["a cat sits", "dogs run in the park"]
        assert runs[True].handle.key == runs[False].handle.key  # the same weights: only the flag tells them apart
        assert cache_key(runs[True], texts) != cache_key(runs[False], texts)
        said: list[str] = []
        for flag, verb in ((True, "extracting"), (False, "extracting"), (True, "reusing"), (False, "reusing")):
            cached_vectors(runs[flag], texts, layers=["1"], poolings=["mean"], say=said.append)
            assert said[-1].startswith(verb), (flag, said)
    finally:
        fake_engine.unregister_fake()


def test_a_cached_store_is_reused_only_when_it_holds_every_asked_pooling(home, fake_run, monkeypatch):
    """A store with ``mean`` alone (as one made before stores held every pooling of the model) does not serve
    a run asking for ``mean`` and ``cls`` (it is extracted anew); the store with both then serves ``cls``."""
    from layerscope.analyses import cache
    from layerscope.analyses.cache import cached_vectors

    texts = ["a cat sits", "dogs run in the park", "a man plays guitar"]
    said: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(cache, "model_poolings", lambda manifest, asked: list(asked))
        cached_vectors(fake_run, texts, layers=["1"], poolings=["mean"], say=said.append)
    assert said[-1].startswith("extracting")
    both = cached_vectors(fake_run, texts, layers=["1"], poolings=["mean", "cls"], say=said.append)
    assert said[-1].startswith("extracting"), said
    assert set(both) == {("mean", "1"), ("cls", "1")}
    cached = cached_vectors(fake_run, texts, layers=["1"], poolings=["cls"], say=said.append)
    assert said[-1].startswith("reusing"), said
    np.testing.assert_array_equal(cached["cls", "1"], both["cls", "1"])
