"""Bad requests are refused before any export, hashing or engine start: a spy on each says it was never called."""

from __future__ import annotations


import pytest

from cli_helpers import cli_output


@pytest.fixture
def spies(monkeypatch):
    """Make the exporter, the weights hash and the engine constructor fail loudly if anything reaches them."""
    import layerscope.engines.base as engines_base
    import layerscope.export.exporter as exporter
    import layerscope.model.identity as identity

    calls: list[str] = []

    def spy(name):
        def called(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called before the request was checked")

        return called

    monkeypatch.setattr(exporter, "export_model", spy("export_model"))
    monkeypatch.setattr(identity, "hash_files", spy("hash_files"))
    monkeypatch.setattr(engines_base, "create_engine", spy("create_engine"))
    return calls


from layerscope.model.identity import hash_files as _real_hash_files  # noqa: E402


def _gpu_engines_unavailable():
    import torch

    return not torch.cuda.is_available()


def one_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in " ".join(err.split()), (n, err)


@pytest.mark.skipif(not _gpu_engines_unavailable(), reason="this machine has a GPU")
@pytest.mark.parametrize("engine", ["cuda", "trt"])
@pytest.mark.parametrize("command", ["extract", "run"])
def test_an_engine_that_cannot_start_here_is_refused_before_the_export(engine, command, spies, tiny_model, tmp_path,
                                                                        capsys):
    model = tiny_model("bert")  # a plain checkpoint: the engine would need an export of it first
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat\n")
    args = (["extract", "--model", model, "--input", corpus, "--out", tmp_path / "s"] if command == "extract"
            else ["run", "compositionality", "--model", model, "--out", tmp_path / "r"])
    code, out, err = cli_output(args + ["--engine", engine], capsys)
    one_error(code, err, f"--engine {engine}", "onnxruntime")
    assert spies == []
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


def test_open_engine_checks_the_engine_before_exporting(spies, tiny_model):
    from layerscope.errors import EngineUnavailableError
    from layerscope.export.open import open_engine

    if not _gpu_engines_unavailable():
        pytest.skip("this machine has a GPU")
    with pytest.raises(EngineUnavailableError, match="--engine cuda"):
        open_engine(str(tiny_model("bert")), "cuda")
    assert spies == []


@pytest.mark.parametrize("args, needles, reads_model", [
    (["--layers", "9"], ["--layers 9"], True),
    (["--pooling", "mean,bogus"], ["bogus", "pooling"], False),
    (["--pooling", "eos"], ["eos", "CLIP"], True),
])
def test_run_checks_layers_and_poolings_before_the_export(args, needles, reads_model, spies, tiny_model, tmp_path,
                                                          capsys):
    """A pooling name needs no model; the layer range and 'eos' need its description (hashed once, remembered)."""
    if reads_model:
        spies.clear()
        import layerscope.model.identity as identity

        identity.hash_files = _real_hash_files
    code, out, err = cli_output(["run", "compositionality", "--model", tiny_model("bert"), "--engine", "ort",
                                 "--out", tmp_path / "r", *args], capsys)
    one_error(code, err, *needles)
    assert [c for c in spies if c != "hash_files" or not reads_model] == []
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, needles", [
    (["--layers", "9"], ["9"]),
    (["--pooling", "bogus"], ["bogus"]),
])
def test_extract_checks_layers_and_poolings_before_the_export(args, needles, spies, tiny_model, tmp_path, capsys):
    import layerscope.model.identity as identity

    identity.hash_files = _real_hash_files  # the layer range needs the model's description (hashed once)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat\n")
    code, out, err = cli_output(["extract", "--model", tiny_model("bert"), "--input", corpus, "--out",
                                 tmp_path / "s", "--engine", "ort", *args], capsys)
    one_error(code, err, *needles)
    assert [c for c in spies if c != "hash_files"] == []


def test_an_unreachable_hub_is_one_line_at_once(tmp_path, capsys, monkeypatch):
    """Without a network: one line naming the hub after one try to reach it, not half a minute of retries."""
    import socket

    import huggingface_hub.constants

    import layerscope.model.source as source

    tries = []

    def no_network(*args, **kwargs):
        tries.append(args)
        raise OSError(-3, "Temporary failure in name resolution")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(source, "_HUB_REACHABLE", {})
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    code, out, err = cli_output(["export", "some-org/not-a-model", "-o", tmp_path / "o"], capsys)
    one_error(code, err, "some-org/not-a-model", "cannot be reached", "not in the local cache", "minilm")
    assert len(tries) == 1, tries  # judged by what it does (no retries), not by the clock
    assert not (tmp_path / "o").exists()
