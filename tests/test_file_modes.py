"""Files layerscope makes follow the user's umask, and nothing is left where an engine never started."""

from __future__ import annotations

import os
import stat

import pytest


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_export_dir_and_lm_head_follow_the_umask(tiny_model, tmp_path, umask_022):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    out = tmp_path / "gpt2-export"
    export_model(resolve_source(str(tiny_model("gpt2"))), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    head = out / "lm_head.safetensors"
    assert head.exists() and stat.S_IMODE(head.stat().st_mode) == 0o644
    for path in out.rglob("*"):
        want = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_no_empty_trt_cache_where_tensorrt_never_started(bert_export, tmp_path):
    import torch

    from layerscope.engines.ort import TensorrtEngine
    from layerscope.errors import EngineUnavailableError
    from layerscope.model.handle import ModelHandle
    from layerscope.extraction.pipeline import extract

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: TensorRT may start")
    with pytest.raises(EngineUnavailableError):
        TensorrtEngine(ModelHandle.resolve(str(bert_export)))
    assert not (bert_export / "trt_cache").exists()
    extract(str(bert_export), ["a cat", "a dog"], tmp_path / "s", engine="auto", layers="-1")  # tries trt first
    assert not (bert_export / "trt_cache").exists()
