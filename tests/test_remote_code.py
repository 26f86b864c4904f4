"""--trust-remote-code reaches every loader (no interactive prompt ever), and ignored custom code is said once."""

from __future__ import annotations

import builtins
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from layerscope.cli import main
from layerscope.model.source import resolve_source

CUSTOM_TOKENIZER = '''from transformers import BertTokenizerFast


class CustomTokenizerFast(BertTokenizerFast):
    """A test tokenizer 'shipped with the model': plain BERT under another class name."""
'''


@pytest.fixture(autouse=True)
def _no_prompt(tmp_path, monkeypatch):
    """Any interactive [y/N] question fails the test (and is recorded), as with a closed stdin."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))  # copies of custom code land here
    # ... and are imported from there: no test reads another's copies (its folder is gone once it passed), so the
    # imported code and the folder transformers put on sys.path are this test's alone
    monkeypatch.setattr(sys, "path", list(sys.path))
    _forget_model_code()
    asked = []

    def no_input(prompt=""):
        asked.append(prompt)
        raise EOFError("stdin is closed")

    monkeypatch.setattr(builtins, "input", no_input)
    yield asked
    _forget_model_code()
    assert not asked, f"an interactive prompt appeared: {asked[0][:200]}"


def _forget_model_code() -> None:
    """Drop the models' own code that transformers imported (its ``transformers_modules`` package)."""
    for name in [m for m in sys.modules if m == "transformers_modules" or m.startswith("transformers_modules.")]:
        del sys.modules[name]


def _custom_tokenizer_model(tiny_model, tmp_path) -> Path:
    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "custom-tok"))
    (model / "tokenization_custom.py").write_text(CUSTOM_TOKENIZER)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "CustomTokenizerFast"
    cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizerFast"]}
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    return model


def test_the_flag_reaches_export_validation_and_the_export_tokenizer(tiny_model, tmp_path):
    from layerscope.export.exporter import export_model
    from layerscope.model.handle import ModelHandle

    model = _custom_tokenizer_model(tiny_model, tmp_path)
    out = tmp_path / "exp"
    manifest = export_model(resolve_source(str(model)), out, trust_remote_code=True)  # validation re-loads the saved tokenizer
    assert manifest.parity.outputs
    tok = ModelHandle.resolve(out, trust_remote_code=True).tokenizer()
    assert type(tok).__name__ == "CustomTokenizerFast"


def test_without_the_flag_custom_tokenizer_code_is_one_line(tiny_model, tmp_path, capsys):
    model = _custom_tokenizer_model(tiny_model, tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["export", str(model), "--out", str(tmp_path / "exp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert "tokenization_custom.CustomTokenizerFast" in err[0] and "--trust-remote-code" in err[0]
    assert not (tmp_path / "exp").exists()


def test_extract_and_run_take_the_flag(tiny_model, tmp_path, capsys):
    model = _custom_tokenizer_model(tiny_model, tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat sat\nthe dog ran\n")
    main(["extract", "--model", str(model), "--engine", "torch", "--input", str(corpus), "--out",
          str(tmp_path / "store"), "--layers", "-1", "--trust-remote-code"])
    assert json.loads((tmp_path / "store" / "store.json").read_text())["complete"]
    main(["run", "compositionality", "--model", str(model), "--engine", "torch", "--layers", "-1",
          "--out", str(tmp_path / "res"), "--no-cache", "--trust-remote-code"])
    assert (tmp_path / "res" / "results.json").exists()


def test_config_auto_map_without_the_flag_warns_once(tiny_model, tmp_path, caplog):
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "custom-model"))
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig", "AutoModel": "modeling_custom.CustomModel"}
    (model / "config.json").write_text(json.dumps(cfg))  # the code files are absent: they must not be needed
    with caplog.at_level(logging.WARNING, logger="layerscope"):
        handle = ModelHandle.resolve(model)
        exported = ensure_export(handle)  # describe, config, weights, tokenizer, validation: all loaders
    warnings = [r.getMessage() for r in caplog.records if "own code" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "AutoModel" in warnings[0] and "ignored" in warnings[0] and "--trust-remote-code" in warnings[0]
    assert exported.manifest.family == "bert"


def test_extract_takes_trust_remote_code_as_an_argument(tiny_model, tmp_path):
    from layerscope.errors import LayerscopeError
    from layerscope.extraction.pipeline import extract

    model = _custom_tokenizer_model(tiny_model, tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat sat\nthe dog ran\n")
    with pytest.raises(LayerscopeError, match="--trust-remote-code"):
        extract(str(model), str(corpus), tmp_path / "refused", engine="torch", layers="-1")
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    report = extract(str(model), str(corpus), tmp_path / "store", engine="torch", layers="-1",
                     trust_remote_code=True)
    assert report.n == 2 and report.store.complete


SCALED_BERT = '''from transformers import BertModel
from transformers.models.bert.modeling_bert import BertEmbeddings


class ScaledEmbeddings(BertEmbeddings):
    def forward(self, *args, **kwargs):
        return 2.0 * super().forward(*args, **kwargs)


class ScaledBertModel(BertModel):
    """The model's own code: BERT whose embedding output is doubled, in the usual module layout."""

    def __init__(self, config, add_pooling_layer=True):
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        self.embeddings = ScaledEmbeddings(config)
        self.post_init()
'''


def _own_code_model(tiny_model, tmp_path, model_type: str, code: str = SCALED_BERT,
                    cls: str = "ScaledBertModel") -> Path:
    """The tiny BERT with modeling code ``code`` (defining ``cls``) in its folder (auto_map in config.json, no
    hub), of ``model_type``; a type transformers does not know gets its own config class too."""
    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / f"own-code-{model_type}"))
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(model_type=model_type, architectures=[cls], auto_map={"AutoModel": f"modeling_scaled.{cls}"})
    if model_type != "bert":
        (model / "configuration_scaled.py").write_text(
            f"from transformers import BertConfig\n\n\nclass ScaledConfig(BertConfig):\n    model_type = {model_type!r}\n")
        cfg["auto_map"]["AutoConfig"] = "configuration_scaled.ScaledConfig"
        code += f"\n\nfrom .configuration_scaled import ScaledConfig  # noqa: E402\n\n{cls}.config_class = ScaledConfig\n"
    (model / "modeling_scaled.py").write_text(code)
    (model / "config.json").write_text(json.dumps(cfg))
    return model


@pytest.mark.parametrize("model_type", ["bert", "scaledbert"])
def test_a_models_own_modeling_code_is_exported_as_that_code_computes(model_type, tiny_model, tmp_path):
    """A checkpoint whose own modeling code doubles the embeddings, of a type transformers knows ('bert', as
    jina-bert) or one only its code defines ('scaledbert', as nomic-bert): with the flag the export's every
    layer equals that code's forward (Hugging Face with trust_remote_code), not the built-in BERT's. Catches:
    the flag not reaching the loader that traces (the built-in class exported, layer 0 half the size), a
    type of the model's own code refused although its layers can be read."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer, BertModel

    from layerscope.engines.ort import make_session
    from layerscope.export.exporter import export_model

    model = _own_code_model(tiny_model, tmp_path, model_type)
    out = tmp_path / "exp"
    manifest = export_model(resolve_source(str(model)), out, pooled=["mean"], trust_remote_code=True)
    assert (manifest.family, manifest.family_from_code) == (model_type, model_type != "bert")
    tok = AutoTokenizer.from_pretrained(str(model))
    enc = tok(["a cat sat on the mat", "hi"], padding=True, return_tensors="np")
    session = make_session(out / "model.onnx", "CPUExecutionProvider")
    feed = {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()}
    names = [f"hidden_states.{i}" for i in range(3)]
    got = dict(zip(names, session.run(names, feed)))
    own = AutoModel.from_pretrained(str(model), trust_remote_code=True).eval()
    assert type(own).__name__ == "ScaledBertModel"
    builtin = BertModel.from_pretrained(str(model)).eval()
    mask = enc["attention_mask"].astype(bool)
    with torch.no_grad():
        want = own(**{k: torch.from_numpy(v) for k, v in feed.items()}, output_hidden_states=True).hidden_states
        plain = builtin(**{k: torch.from_numpy(v) for k, v in feed.items()}, output_hidden_states=True).hidden_states
    for i, name in enumerate(names):
        np.testing.assert_allclose(got[name][mask], want[i].numpy()[mask], atol=1e-5, err_msg=name)
    assert not np.allclose(got["hidden_states.0"][mask], plain[0].numpy()[mask], atol=1e-3)


def test_a_type_only_the_models_own_code_defines_is_one_line_without_the_flag(tiny_model, tmp_path, capsys):
    """Catches: 'a newer transformers may know it' for a type that is the model's own, a line that does not
    say which flag runs it, and weights read first (the weights file here is garbage: reading it would be
    another error)."""
    model = _own_code_model(tiny_model, tmp_path, "scaledbert")
    (model / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SystemExit) as exc:
        main(["export", str(model), "--out", str(tmp_path / "exp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "model type 'scaledbert' exists only in the model's own code (AutoModel = " \
           "modeling_scaled.ScaledBertModel), which runs only with --trust-remote-code" in err[0]
    assert not (tmp_path / "exp").exists()


def test_an_export_of_the_models_own_type_is_read_again_from_its_manifest(tiny_model, tmp_path, monkeypatch):
    """In a process that never read the checkpoint's config (its family derived again from the manifest's
    kind), the export of a type only the model's own code defines runs on ONNX Runtime and on the torch
    engine (the model's own code, with the flag), which agree on every layer.  Catches: a family known only
    to the process that exported (a KeyError for 'scaledbert' in a later run), torch reading the built-in
    BERT or refusing the type."""
    import numpy as np

    from layerscope.engines.base import create_engine
    from layerscope.model import families
    from layerscope.model.handle import ModelHandle

    model = _own_code_model(tiny_model, tmp_path, "scaledbert")
    main(["export", str(model), "--out", str(tmp_path / "exp"), "--trust-remote-code"])
    monkeypatch.setattr(families, "_FROM_CODE", {})  # as a new process: nothing derived from the config yet
    handle = ModelHandle.resolve(tmp_path / "exp", trust_remote_code=True)
    family = handle.family()
    assert (family.name, family.kind, family.export_path) == ("scaledbert", "encoder", "torch")
    ort = create_engine("ort", handle)
    batch = ort.encoder()(["a cat sat on the mat", "hi"])
    layers = list(handle.manifest.layers)
    valid = batch.mask.astype(bool)
    for layer, a, b in zip(layers, create_engine("torch", handle).run_tokens(batch, layers),
                           ort.run_tokens(batch, layers)):
        np.testing.assert_allclose(a[valid], b[valid], atol=1e-5, err_msg=f"layer {layer}")


NO_STATES_BERT = '''from transformers import BertModel


class NoStatesModel(BertModel):
    """The model's own code: BERT that never hands back its hidden states."""

    def forward(self, *args, output_hidden_states=None, **kwargs):
        return super().forward(*args, **kwargs)
'''


def test_own_code_that_returns_no_hidden_states_is_one_line(tiny_model, tmp_path, capsys):
    """Catches: a traceback (or an export of the last layer only) for a model whose own code ignores
    output_hidden_states."""
    model = _own_code_model(tiny_model, tmp_path, "nostates", NO_STATES_BERT, "NoStatesModel")
    with pytest.raises(SystemExit) as exc:
        main(["export", str(model), "--out", str(tmp_path / "exp"), "--trust-remote-code"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code != 0 and len(err) == 1, err
    assert "NoStatesModel returned no hidden states for output_hidden_states=True" in err[0], err
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize("classes,kind", [
    ({"AutoModel": "m.Base", "AutoModelForCausalLM": "m.Causal"}, "decoder"),
    ({"AutoModel": "m.Base", "AutoModelForMaskedLM": "m.Masked", "AutoModelForCausalLM": "m.Causal"}, "encoder"),
    ({"AutoModel": "m.Base", "AutoModelForSequenceClassification": "m.Cls"}, "encoder"),
    ({"AutoModelForCausalLM": "m.Causal"}, None),
])
def test_the_kind_of_a_models_own_code_is_read_from_its_auto_map(classes, kind):
    """Catches: a decoder of the model's own code pooled and decoded as an encoder (its tokens read with 'mean'
    and no causal head), and code without a base model class let through to a loader that cannot read it."""
    from layerscope.errors import InputError
    from layerscope.model.families import code_family, code_kind

    if kind is None:
        with pytest.raises(InputError, match="registers no AutoModel class"):
            code_kind("mine", classes)
        return
    assert code_kind("mine", classes) == kind
    family = code_family("mine", kind)
    assert (family.kind, family.default_pooling, family.export_path) == \
        (kind, "last" if kind == "decoder" else "mean", "torch")


def test_variants_of_an_export_of_the_models_own_type_take_the_users_flag(tiny_model, tmp_path, capsys):
    """int8 and fp16 of an export of a type only the model's own code defines, checked against that code (its
    parity recorded per output); without --trust-remote-code one line that names the flag, nothing written.
    Catches: the flag not reaching the variant's torch reference (a ModelNotFoundError for the type), and a
    manifest alone turning the model's own code on."""
    from layerscope.model.manifest import read_manifest

    model = _own_code_model(tiny_model, tmp_path, "scaledbert")
    out = tmp_path / "exp"
    main(["export", str(model), "--out", str(out), "--trust-remote-code", "--no-cpu-precisions"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(out), "--variant", "int8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "'scaledbert'" in err[0] and "--trust-remote-code" in err[0], err
    assert not (out / "model.int8.onnx").exists() and read_manifest(out).variant("int8") is None
    main(["optimize", str(out), "--variant", "int8,fp16", "--trust-remote-code"])
    manifest = read_manifest(out)
    for kind in ("int8", "fp16"):
        entry = manifest.variant(kind)
        assert entry is not None and (out / entry.file).exists(), kind
        outputs = entry.parity.outputs
        assert {f"hidden_states.{i}" for i in range(3)} <= set(outputs), (kind, sorted(outputs))
        assert min(o.min_cos for o in outputs.values()) >= entry.tolerance["min_cos"], kind
    # the fp16 file follows the model's own code (Hugging Face with trust_remote_code), not the built-in BERT
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layerscope.engines.ort import make_session

    enc = AutoTokenizer.from_pretrained(str(model))(["a cat sat on the mat"], return_tensors="np")
    session = make_session(out / manifest.variant("fp16").file, "CPUExecutionProvider")
    feed = {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()}
    got = session.run(["hidden_states.0"], feed)[0][0]
    own = AutoModel.from_pretrained(str(model), trust_remote_code=True).eval()
    with torch.no_grad():
        want = own(**{k: torch.from_numpy(v) for k, v in feed.items()}, output_hidden_states=True).hidden_states[0]
    np.testing.assert_allclose(got, want[0].numpy(), rtol=0, atol=2e-2)  # fp16 rounding of values near 2


def _as_sentence_transformer(model: Path) -> Path:
    """The files sentence-transformers reads beside the checkpoint: its own Transformer module, then mean pooling."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "1_Pooling").mkdir()
    hidden = json.loads((model / "config.json").read_text())["hidden_size"]
    (model / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}))
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    return model


def test_bench_of_an_export_of_the_models_own_type_takes_the_users_flag(tiny_model, tmp_path, capsys, monkeypatch):
    """A tiny bench (4 texts, 1 round, 1 pass) of an export of a type only the model's own code defines: without
    --trust-remote-code one line naming the flag, before any row runs or anything is written; with it every row
    that loads the model runs that code (the hf-eager reference, the torch engine, the sentence-transformers
    peer), and ONNX Runtime's export of that code equals the reference on every layer. Catches: a row loading
    the model without the user's flag (that row unavailable: transformers refuses the model's code), a manifest
    alone turning the code on, and a bench that runs its rows before saying the flag is missing. Each row runs
    its worker (bench/worker.py) on its job file here rather than in a process of its own, to keep this short."""
    from layerscope.bench import isolated, worker

    def row_here(job, work, timeout_s):  # the row's job file and worker, without a process and torch import per row
        out = Path(job["out_dir"])
        out.mkdir(parents=True)
        (out / "job.json").write_text(json.dumps(job))
        worker.main([str(out / "job.json")])
        return json.loads((out / "result.json").read_text())

    monkeypatch.setattr(isolated, "_run_worker", row_here)
    model = _as_sentence_transformer(_own_code_model(tiny_model, tmp_path, "scaledbert"))
    exp = tmp_path / "exp"
    main(["export", str(model), "--out", str(exp), "--trust-remote-code", "--no-cpu-precisions"])
    capsys.readouterr()
    out = tmp_path / "bench"
    args = ["bench", "--model", str(exp), "--engines", "ort,torch", "--peers", "st-torch", "--synthetic", "4",
            "--rounds", "1", "--passes", "1", "--no-plot", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "'scaledbert'" in err[0] and "hf-eager" in err[0] and "--trust-remote-code" in err[0], err
    assert not out.exists()
    main([*args, "--trust-remote-code"])
    by = {r["engine"]: r for r in json.loads((out / "bench.json").read_text())["results"]}
    assert list(by) == ["hf-eager", "ort", "torch", "st-torch"]
    for name, row in by.items():
        assert row["available"], (name, row.get("reason"))
    for name in ("ort", "torch"):  # every layer of the export and of the torch engine equals the reference's
        assert set(by[name]["accuracy"]) == {"0", "1", "2"}, name
        for layer, acc in by[name]["accuracy"].items():
            assert acc["max_abs"] <= 1e-4 and acc["min_cos"] >= 0.9999, (name, layer, acc)
    assert by["st-torch"]["min_cos"] >= 0.9999  # its mean of the last layer, normalized: the direction compares


def test_an_export_of_the_models_own_code_of_a_known_type_never_runs_without_it(tiny_model, tmp_path, capsys):
    """An export made with --trust-remote-code of a type transformers knows ('bert', with its own modeling file in
    auto_map, as jina-bert-style checkpoints ship), used without the flag: every path that would load the model in
    PyTorch (an extraction on the torch engine, in process and as the driver of --shard and Ray; the engine door
    itself; an analysis; a variant, its attention graph included; the bench) is one line naming the flag before
    any work, and nothing is written. Catches: the built-in BertModel's vectors stored under the export's
    identity (exit 0, no word), an attention graph traced from the plain class into the export, and int8 refused
    for a wrong reason."""
    from layerscope.engines.base import create_engine
    from layerscope.errors import InputError
    from layerscope.extraction.prepare import prepare_extraction
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest import read_manifest

    model = _own_code_model(tiny_model, tmp_path, "bert")
    exp = tmp_path / "exp"
    main(["export", str(model), "--out", str(exp), "--trust-remote-code", "--no-cpu-precisions"])
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat sat\nthe dog ran\n")
    capsys.readouterr()
    commands = [
        (["extract", "--model", str(exp), "--engine", "torch", "--input", str(corpus), "--out", str(tmp_path / "s")],
         "engine 'torch'"),
        (["run", "compositionality", "--model", str(exp), "--engine", "torch", "--layers", "-1", "--out",
          str(tmp_path / "r"), "--no-cache"], "engine 'torch'"),
        (["optimize", str(exp), "--variant", "attn"], "variant 'attn'"),
        (["optimize", str(exp), "--variant", "int8"], "variant 'int8'"),
        (["bench", "--model", str(exp), "--engines", "ort", "--synthetic", "4", "--rounds", "1", "--passes", "1",
          "--no-plot", "--out", str(tmp_path / "b")], "hf-eager"),
    ]
    for args, what in commands:
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1, (args, err)
        assert "modeling_scaled.ScaledBertModel" in err[0] and "--trust-remote-code" in err[0] and what in err[0], err
    assert not any((tmp_path / d).exists() for d in ("s", "r", "b"))
    manifest = read_manifest(exp)
    assert not manifest.variants and not (exp / "model.attn.onnx").exists() and not (exp / "model.int8.onnx").exists()
    assert manifest.source.own_code == ("AutoModel = modeling_scaled.ScaledBertModel",)
    handle = ModelHandle.resolve(exp)
    with pytest.raises(InputError, match="--trust-remote-code"):
        create_engine("torch", handle)
    for runs_here in (True, False):  # in process and --shard workers; the Ray driver (its workers elsewhere)
        with pytest.raises(InputError, match="--trust-remote-code"):
            prepare_extraction(str(exp), str(corpus), tmp_path / "s", engine="torch", engine_runs_here=runs_here)
    assert not (tmp_path / "s").exists()
    create_engine("ort", handle)  # the graph itself runs no code of the model's: no flag needed
    # with the flag, the torch engine runs the model's own code: its layer 0 is the doubled embeddings
    import numpy as np

    own = ModelHandle.resolve(exp, trust_remote_code=True)
    ort, torch_engine = create_engine("ort", own), create_engine("torch", own)
    batch = ort.encoder()(["a cat sat on the mat"])
    np.testing.assert_allclose(torch_engine.run_tokens(batch, ["0"])[0], ort.run_tokens(batch, ["0"])[0], atol=1e-5)
