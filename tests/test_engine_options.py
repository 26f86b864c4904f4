"""Engine options are declared per engine: a typo is one line with the closest name, before anything starts;
analyses that need gradients run on the engine the registry's flag names."""

from __future__ import annotations

import pytest

from layerscope.engines import registry
from layerscope.engines.registry import AutoRank, EngineOption, EngineSpec
from layerscope.errors import InputError


def test_a_mistyped_option_is_refused_with_the_closest_name_before_the_model_is_read(tmp_path):
    """Catches: an option the engine swallows silently (``thread=2`` ran with the default threads)."""
    from layerscope.engines.base import create_engine

    missing = tmp_path / "no-such-model"  # never read: the option is checked first
    with pytest.raises(InputError) as err:
        create_engine("torch", str(missing), thread=2)
    line = str(err.value)
    assert "engine 'torch' has no option 'thread'" in line and "did you mean 'threads'" in line
    assert "device" in line and "\n" not in line
    with pytest.raises(InputError, match="did you mean 'in_graph_pooling'"):
        create_engine("ort", str(missing), in_graph_poolng=False)
    with pytest.raises(InputError, match=r"threads='2' must be int"):
        create_engine("torch", str(missing), threads="2")


def test_auto_takes_any_engines_options_and_still_refuses_a_typo(tmp_path):
    """Catches: auto refusing an option meant for the engine it picks, or passing a typo on."""
    registry.check_engine_options("auto", {"variant": "int8", "in_graph_pooling": False, "min_cosine": 0.99,
                                           "device_id": 0, "threads": 2})
    with pytest.raises(InputError, match="did you mean 'variant'"):
        registry.check_engine_options("auto", {"varaint": "int8"})


def test_open_engine_refuses_a_typo_before_exporting(tiny_model, tmp_path, monkeypatch):
    """Catches: a plain model exported into the cache (minutes for a big one) before a typo is reported."""
    from layerscope.export.open import open_engine

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    with pytest.raises(InputError, match="did you mean 'opt_level'"):
        open_engine(str(tiny_model("bert")), "ort", opt_levle="none")
    assert not (tmp_path / "home" / "exports").exists()


class _Started(Exception):
    pass


@pytest.fixture
def gradly(monkeypatch):
    """A test engine that declares gradients, the way an engine module does."""
    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))

    def factory(handle, **options):
        raise _Started(handle.spec)

    registry.register(EngineSpec("gradly", "a test engine with gradients", needs_export=False, device="cpu",
                                 gradients=True, options=(EngineOption("depth", int, 1),)))(factory)
    return factory


def test_the_gradient_engine_follows_the_registry_flag(gradly, monkeypatch):
    assert registry.gradient_engine("gradly") == "gradly"
    assert registry.gradient_engine("torch") == "torch"
    assert registry.gradient_engine("auto") == "torch"  # no ranked engine declares gradients: the fallback
    with pytest.raises(InputError, match="cannot compute gradients"):
        registry.gradient_engine("ort")
    registry.register(EngineSpec("gradfast", "a ranked test engine with gradients", needs_export=False,
                                 device="cpu", gradients=True, auto=(AutoRank(1, None, "fp32"),)))(gradly)
    assert registry.gradient_engine("auto") == "gradfast"


def test_an_analysis_needing_gradients_starts_the_flagged_engine(gradly, tiny_model, tmp_path):
    """Catches: the engine for gradients chosen by the literal name 'torch' (a declared engine ignored)."""
    from layerscope.analyses.base import RunRequest, run_analysis

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"text": "text number {i} is here", "label": "{"ab"[i % 2]}"}}\n' for i in range(8)),
                    encoding="utf-8")
    model = str(tiny_model("bert"))
    ctx = RunRequest(models=[model], engine="gradly", out=tmp_path / "out", data=str(data), poolings=["mean"],
                     cache=False, options={"k": 2, "ig_steps": 2, "random_draws": 1})
    with pytest.raises(_Started, match="bert"):
        run_analysis("saliency", ctx)
