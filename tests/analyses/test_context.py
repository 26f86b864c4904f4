"""An analysis reads its run through ``Context``: the run's spec and typed options, nothing else.

The request (``RunRequest``) is made into the spec once; the spec ``prepare`` reads already holds the
analysis's default data file, and the spec ``offline``/``compute`` read is the same one with the models
resolved.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
from pathlib import Path

import pytest

import layerscope.analyses as analyses_package
from layerscope.analyses.base import Context, RunRequest

READABLE = {"spec", "opts", "console", "say", "vectors"}  # what an analysis may read of its Context


def _ctx_reads(source: str) -> list[tuple[int, str]]:
    """Every ``ctx.<name>`` in ``source`` (read or written) with its line."""
    return [(node.lineno, node.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx"]


def test_analyses_read_only_the_spec_and_options_of_their_context():
    """Catches: an analysis reading a request field (ctx.data, ctx.seed, ...) beside the spec, so that the
    spec and what the figures were made with could differ."""
    assert {f.name for f in dataclasses.fields(Context)} == {"spec", "opts", "console", "cache"}
    folder = Path(analyses_package.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert len(modules) > 15  # every analysis module is looked at
    loose = [f"{p.name}:{line} ctx.{attr}" for p in modules
             for line, attr in _ctx_reads(p.read_text(encoding="utf-8")) if attr not in READABLE]
    assert loose == []
    # the check itself finds such a read
    assert _ctx_reads("def f(ctx):\n    return ctx.data or ctx.spec.data\n") == [(2, "data"), (2, "spec")]


def test_the_spec_prepare_reads_holds_the_default_data_file_and_its_hash(tmp_path, monkeypatch):
    """Catches: a default data file chosen inside prepare and never recorded (the run's identity would not
    see which file was read)."""
    from layerscope.analyses.base import get_analysis

    sts = tmp_path / "sts" / "sts-test.csv"
    sts.parent.mkdir()
    rows = ["main-news\tf\t2012\t0001\t4.0\tA cat sits.\tA cat is sitting.",
            "main-news\tf\t2012\t0002\t0.5\tA man runs.\tThe sky is blue.",
            "main-news\tf\t2012\t0003\t2.0\tTwo dogs play.\tA dog sleeps."]
    sts.write_bytes(("\n".join(rows) + "\n").encode("utf-8"))
    monkeypatch.setenv("LAYERSCOPE_STS_DIR", str(sts.parent))
    ctx = Context.asked("sts", RunRequest(models=["a", "b"], options={"n_boot": 0}))
    assert ctx.spec.data == str(sts)
    assert ctx.spec.data_sha256 == hashlib.sha256(sts.read_bytes()).hexdigest()
    assert (ctx.spec.models, ctx.spec.given_models) == ((), ("a", "b"))  # models not yet resolved
    assert len(get_analysis("sts")().prepare(ctx)["test"]) == 3  # prepare reads the file the spec names
    items = Path(analyses_package.__file__).parents[1] / "data" / "compositionality.jsonl"
    assert Context.asked("compositionality", RunRequest(models=["a"])).spec.data == str(items)
    given = tmp_path / "mine.tsv"
    assert Context.asked("sts", RunRequest(models=["a"], data=given)).spec.data == str(given)


def test_engine_options_and_analysis_options_are_typed_apart():
    """Catches: engine options given in the options dict (a library caller's habit) taken for an analysis
    option, or lost from the spec."""
    req = RunRequest(models="a", data="x.tsv", engine_options={"min_cosine": 0.9},
                     options={"engine_options": {"variant": "int8"}, "n_boot": 7})
    ctx = Context.asked("sts", req)
    assert ctx.spec.engine_options == (("min_cosine", 0.9), ("variant", "int8"))
    assert ctx.opts.n_boot == 7 and not hasattr(ctx.opts, "engine_options")
    assert dict(ctx.spec.options)["n_boot"] == 7
    assert req.models == ("a",)  # one model named as a string is one model
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.spec = None  # type: ignore[misc]


def test_offline_and_combine_read_the_spec_prepare_read_with_the_models_resolved(tmp_path, monkeypatch):
    """Catches: a run whose later steps read another description of the run than the one prepare read (or
    one without the resolved models)."""
    import layerscope.analyses.registry as registry_module
    from layerscope.analyses.base import Analysis, AnalysisMetadata, Option, run_analysis
    from layerscope.model.manifest_type import SourceInfo

    seen: dict[str, object] = {}

    class Probe(Analysis):
        metadata = AnalysisMetadata(name="probe-context", description="records its context", inputs=("texts",),
                                    main_score="n", options=(Option("scale", int, 1, "a factor"),))

        def prepare(self, ctx):
            seen["prepare"] = ctx.spec
            return ["x", "y", "z"]

        def stored_sources(self, ctx, data):
            return [("words", SourceInfo(spec="words", path_or_id="words", alias="words"), "words-v1")]

        def offline(self, ctx, data):
            seen["offline"] = ctx.spec
            n = len(data) * ctx.opts.scale
            return {"words": {"summary": {"n": n}, "tables": {"rows": [{"n": n}]}}}, {"words": {}}

        def combine(self, ctx, per_model, data):
            seen["combine"] = ctx.spec
            return {}

        def compute(self, ctx, run, data):
            raise AssertionError("no model runs here")

    monkeypatch.setattr(registry_module, "_REGISTRY", {**registry_module.registry(), "probe-context": Probe})
    outcome = run_analysis("probe-context", RunRequest(models=["words"], seed=5, options={"scale": 2},
                                                       out=tmp_path / "out"))
    assert outcome.results["per_model"]["words"]["summary"]["n"] == 6
    before, after = seen["prepare"], seen["offline"]
    assert before.models == () and [m.given for m in after.models] == ["words"]
    assert after.models[0].key == "words-v1" and after.seed == before.seed == 5
    assert after == dataclasses.replace(before, models=after.models) == seen["combine"] == outcome.spec
