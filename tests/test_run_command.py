"""`layerscope run NAME`: one command per analysis, built from the options its metadata declares.

No model runs here: where a run would start, ``run_analysis`` is replaced by a recorder, so these
tests check what the CLI hands the library (the RunRequest), its help, and its one-line errors.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from cli_helpers import cli_output

from layerscope.analyses import base
from layerscope.errors import InputError


@pytest.fixture
def wide_help(monkeypatch):
    """Help printed on one wide line per option, so an option and its help can be found together."""
    import typer.rich_utils

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)


def _help(name, capsys):
    code, out, err = cli_output(["run", name, "--help"], capsys)
    assert code == 0, err
    return out


def test_run_help_lists_the_analysis_options_with_their_help(capsys, wide_help):
    text = _help("sts", capsys)
    probe = [line for line in text.splitlines() if "--probe " in line]
    assert probe and "also train learned similarity probes over the per-layer vectors" in probe[0]
    assert "one of: all, cosine-mlp, siamese" in text  # declared choices are shown
    assert "--model" in text and "--layers" in text  # with the options every analysis has
    text = _help("alignment", capsys)
    for flag, words in (("--generate", "built-in pairs instead of --data"), ("--n ", "pairs to generate")):
        assert any(flag in line and words in line for line in text.splitlines()), (flag, text)
    assert "--probe " not in text  # another analysis's option is not offered


def test_every_declared_option_of_every_analysis_is_in_its_help(capsys, wide_help):
    for name, cls in sorted(base.registry().items()):
        text = _help(name, capsys)
        for option in cls.metadata.options:
            assert any(option.flag + " " in line and option.help[:30] in line for line in text.splitlines()), \
                (name, option.flag)
        data_line = next(line for line in text.splitlines() if "--data " in line)
        default = cls.metadata.default_data
        # --data says what this analysis reads by default, or that it reads nothing unless given
        assert (str(default) if default is not None else "(default: none)") in data_line, (name, data_line)


class _Stop(InputError):
    """Raised where the run would start; the CLI turns it into exit code 2 like any bad input."""


@pytest.fixture
def recorded(monkeypatch):
    """The RunRequest the CLI would run with (the run itself is stopped before any model loads)."""
    seen = {}

    def record(name, ctx):
        seen["name"], seen["ctx"] = name, ctx
        raise _Stop("stopped before the run")

    monkeypatch.setattr(base, "run_analysis", record)
    return seen


def _options_of(name, args, recorded, capsys=None):
    code, out, err = cli_output(["run", *args] if name is None else ["run", name, *args], capsys)
    assert code == 2 and "stopped before the run" in err, out + err
    return recorded["ctx"]


def test_options_arrive_typed_with_every_default(recorded, capsys):
    ctx = _options_of("sts", ["--n-boot", "7", "--probe", "--probe-kind", "siamese", "--model", "a", "-m", "b"],
                      recorded, capsys)
    defaults = {o.name: o.default for o in base.get_analysis("sts").metadata.options}
    assert ctx.options == {**defaults, "n_boot": 7, "probe": True, "probe_kind": "siamese"}
    assert type(ctx.options["n_boot"]) is int and ctx.options["probe_epochs"] is None
    # no --pooling: None, so each model gets the analysis's default for its family (sts: mean,cls for encoders,
    # last,mean for decoders; tests/analyses/test_decoder_defaults.py)
    assert ctx.models == ("a", "b") and ctx.poolings is None
    assert recorded["name"] == "sts"
    ctx = _options_of("saliency", ["--eval-fraction", "0.25"], recorded, capsys)
    assert ctx.options["eval_fraction"] == 0.25 and ctx.options["k"] == 10


def test_shared_options_before_the_analysis_name_still_apply(recorded, capsys):
    ctx = _options_of("sts", ["--layers", "0"], recorded, capsys)
    assert ctx.layers == "0" and ctx.models == ("minilm",)
    ctx = _options_of(None, ["--layers", "-1", "--model", "x", "sts", "--seed", "3"], recorded, capsys)
    assert ctx.layers == "-1" and ctx.models == ("x",) and ctx.seed == 3


@pytest.mark.parametrize("args, needles", [
    (["sts", "--prob"], ["analysis 'sts' has no option --prob", "did you mean '--probe'", "--n-boot"]),
    (["alignment", "--dvice", "cpu"], ["did you mean '--device'", "--generate"]),
    (["sts", "--modle", "x"], ["did you mean '--model'"]),
    (["sts", "--probe-kind", "siamse"], ["unknown --probe-kind 'siamse'", "did you mean 'siamese'",
                                         "choose from all, cosine-mlp, siamese"]),
    (["sts", "--n-boot", "many"], ["run sts:", "--n-boot"]),
    (["stss"], ["unknown analysis 'stss'", "did you mean 'sts'"]),
])
def test_bad_options_are_one_line(args, needles, capsys, recorded):
    code, out, err = cli_output(["run", *args], capsys)
    assert code == 2 and "Traceback" not in out + err
    errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out + err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert "ctx" not in recorded  # nothing ran


TINY = '''
from pathlib import Path

from layerscope.analyses.base import Analysis, AnalysisMetadata, Option, register


@register
class WordCount(Analysis):
    metadata = AnalysisMetadata(name="wordcount-e10", description="Counts the words of a file", inputs=("texts",),
                                main_score="words", default_data="none",
                                options=(Option("scale", int, 1, "multiply the count by this"),))

    def prepare(self, ctx):
        return Path(ctx.spec.data).read_text(encoding="utf-8").split()

    def stored_sources(self, ctx, data):  # made without a model
        from layerscope.model.manifest_type import SourceInfo

        return [("words", SourceInfo(spec="words", path_or_id="words", alias="words"), "words-v1")]

    def offline(self, ctx, data):
        count = len(data) * ctx.opts.scale
        return {"words": {"summary": {"words": count}, "tables": {"counts": [{"words": count}]}}}, {"words": {}}

    def compute(self, ctx, run, data):
        raise AssertionError("no model runs in this analysis")
'''


def test_a_new_analysis_is_one_file(tmp_path, monkeypatch, capsys):
    import layerscope.analyses as package

    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "wordcount_e10.py").write_text(textwrap.dedent(TINY), encoding="utf-8")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    import layerscope.analyses.registry as analyses_registry

    monkeypatch.setattr(analyses_registry, "_REGISTRY", dict(analyses_registry._REGISTRY))
    monkeypatch.delitem(sys.modules, "layerscope.analyses.wordcount_e10", raising=False)
    try:
        assert "wordcount-e10" in base.registry()
        code, out, _ = cli_output(["analyses"], capsys)
        assert code == 0 and "wordcount-e10" in out and "--scale" in out
        data = tmp_path / "words.txt"
        data.write_text("one two three\nfour\n", encoding="utf-8")
        out_dir = tmp_path / "res"
        code, out, err = cli_output(["run", "wordcount-e10", "--data", data, "--scale", "3", "--out", out_dir],
                                    capsys)
        assert code == 0, out + err
        results = json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
        assert results["per_model"]["words"]["summary"]["words"] == 12  # 4 words x --scale 3
        assert results["settings"]["options"] == {"scale": 3}
    finally:
        sys.modules.pop("layerscope.analyses.wordcount_e10", None)
