"""In-process, ``--shard`` and Ray open the engine with the same options for the same request.

Ray runs here without a cluster: ``ray.data`` is replaced by a stand-in that builds the driver's
``RangeActor`` in this process and feeds it the ranges, so the options it opens its engine with are seen.
"""

from __future__ import annotations

import json

import numpy as np
import pytest


pytestmark = pytest.mark.usefixtures("fake")  # the test-only engine (tests/extraction/conftest.py)
TEXTS = [f"text number {i} " + "word " * (i % 7) for i in range(40)]


@pytest.fixture
def opened(monkeypatch):
    """The options of every engine opened in this process, in order."""
    import layerscope.export.open as open_mod
    from layerscope.extraction import pipeline

    seen: list[dict] = []
    real = open_mod.open_engine

    def spy(model, engine="auto", **options):
        seen.append({k: v for k, v in options.items() if k != "trust_remote_code"})
        return real(model, engine, **options)

    monkeypatch.setattr(open_mod, "open_engine", spy)
    monkeypatch.setattr(pipeline, "open_engine", spy)
    return seen


class _Rows:
    """``ray.data``'s dataset as the driver uses it: ``map_batches`` with an actor class, then ``iter_rows``."""

    def __init__(self, items):
        self.items = items

    def map_batches(self, actor, *, fn_constructor_kwargs, **_):
        worker = actor(**fn_constructor_kwargs)
        rows = []
        for item in self.items:
            out = worker({k: np.asarray([v]) for k, v in item.items()})
            rows.append({k: v[0] for k, v in out.items()})
        return _Rows(rows)

    def iter_rows(self):
        return iter(self.items)


@pytest.fixture
def ray_here(monkeypatch):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    import layerscope.extraction.ray_extract as ray_extract

    monkeypatch.setattr(ray_extract, "connect", lambda address, **kw: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(ray.data, "from_items", lambda items, **kw: _Rows(items))
    return ray_extract.extract_ray


def test_in_process_shard_and_ray_open_the_engine_with_the_same_options(tiny_model, tmp_path, opened, ray_here):
    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard

    model = str(tiny_model("bert"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    # threads given: Ray would otherwise give each actor its share of the CPUs
    kw = dict(engine="fake", layers="0,1", poolings=["mean"], max_batch=16, engine_options={"threads": 1})
    extract(model, str(corpus), tmp_path / "plain", **kw)
    extract_shard(ExtractionRequest.of(model, str(corpus), tmp_path / "shard", **kw), 0, 1)
    ray_here(model, str(corpus), tmp_path / "ray", workers=1, cpus_per_worker=1, gpus_per_worker=0, **kw)

    assert len(opened) == 3, opened
    plain, shard, ray = opened
    # by hand: the two layers asked for run to depth 1, the model's own limit bounds the sequence, the
    # tiny BERT's graph pools nothing (no pooled-only run), the user's option is kept
    limit = json.loads((tmp_path / "plain" / "store.json").read_text())["manifest"]["max_length"]
    assert plain == {"max_batch": 16, "max_seq": limit, "depth": 1, "pooled_only": False, "threads": 1}
    assert shard == plain and ray == plain
    assert max(len(t.split()) for t in TEXTS) + 2 < limit  # the corpus alone would have given a shorter profile
