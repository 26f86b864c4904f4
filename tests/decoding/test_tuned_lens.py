"""The tuned lens's translators and its figures against tuned-lens 0.2's own classes, both ways, on tiny decoders
whose output is peaked (tests/tuned_models.py): a lens layerscope saves is loaded by ``TunedLens.from_model_and_pretrained``
and decodes what ours decodes, layer by layer; tuned-lens's own evaluation (its ``Eval`` step: KL to the final
distribution, cross-entropy of the next token) gives our per-position KL and log-probabilities, from the torch head
and from the ONNX lens graph; a lens tuned-lens saves reads into ours unchanged. A params.pt whose pickle names
anything beyond a state dict of tensors is refused before torch reads it."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
import torch

from layerscope.decoding.heads import load_decoding_model, model_inputs
from layerscope.decoding.lens import torch_lens
from layerscope.decoding.tuned_lens import (LensConfig, Translators, head_unembedding, read_lens, translated_head,
                                            unembedding_hash, write_lens)
from layerscope.errors import InputError
from layerscope.model.handle import ModelHandle

TEXTS = ["the cat sat on a mat while rivers flow", "birds sing over quiet hills", "old towns"]


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def peaked(tiny_model, tmp_path_factory):
    """``peaked("gpt2" | "llama") -> (model dir, HF causal LM, our DecodingModel, handle)``, made once."""
    from tiny_zoo import build_zoo_model
    from transformers import AutoModelForCausalLM
    from tuned_models import sharpened

    made = {}

    def get(family):
        if family not in made:
            root = tmp_path_factory.mktemp(f"peaked-{family}")
            src = tiny_model(family) if family == "gpt2" else build_zoo_model(family, root / "base")
            path = sharpened(src, root / "model", "decoder")
            handle = ModelHandle.resolve(str(path))
            made[family] = (path, AutoModelForCausalLM.from_pretrained(str(path)).eval(), load_decoding_model(handle),
                            handle)
        return made[family]

    return get


def _random_translators(layers: int, width: int, seed: int = 0) -> Translators:
    rng = np.random.default_rng(seed)
    return Translators(rng.normal(0, 0.1, (layers, width, width)).astype(np.float32),
                       rng.normal(0, 0.1, (layers, width)).astype(np.float32))


def _config(handle, decoding) -> LensConfig:
    m = handle.manifest
    return LensConfig(base_model_name_or_path=str(m.source.path_or_id), d_model=int(m.hidden_size),
                      num_hidden_layers=int(m.num_layers), unembed_hash=unembedding_hash(head_unembedding(decoding)))


def _their_eval(their_lens, hidden, final_logits, input_ids):
    """tuned-lens's own per-layer evaluation step (``Eval._evaluate_lenses_on_hidden``, next-token shift): per
    layer its per-position KL ``[B, S]`` and next-token cross-entropy ``[B, S - 1]``."""
    from tuned_lens.scripts.eval_loop import Eval
    from tuned_lens.utils import shift_labels

    final_lps = final_logits.log_softmax(dim=-1)
    out = {}
    step = types.SimpleNamespace(token_shift=1, layer_transfer=False, _record_logit_stats=lambda *a: None)
    for j in range(len(their_lens)):
        got: dict = {"tuned": {"ce": {}, "kl": {}, "entropy": {}}}
        Eval._evaluate_lenses_on_hidden(step, {"tuned": their_lens}, hidden[j], j, final_lps.exp(), final_lps,
                                        shift_labels(input_ids, 1), got, len(their_lens))
        out[j] = (got["tuned"]["kl"][f"layer_{j}"], got["tuned"]["ce"][f"layer_{j}"].reshape(len(input_ids), -1))
    return out


@pytest.fixture(scope="module")
def tuned_lens_eval():
    from tuned_models import tuned_lens_scripts

    with tuned_lens_scripts():
        yield


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_our_lens_loads_in_tuned_lens_and_decodes_and_scores_the_same(peaked, tmp_path, caplog, family,
                                                                      tuned_lens_eval):
    """Catches: a translator applied as ``W h`` instead of ``h + W h`` (tuned-lens's residual form) or with its
    weight transposed, a layer's translator used at another layer, the final norm left out or applied twice
    before the unembedding, params.pt or config.json in a layout tuned-lens does not read (or an unembed_hash it
    warns about), KL taken the wrong way round (``KL(layer || final)``) or from a float32 softmax that loses the
    tail, and the next-token log-probability read at the wrong position."""
    from tuned_lens import TunedLens as TheirLens

    path, net, decoding, handle = peaked(family)
    layers, width = decoding.num_layers, int(handle.manifest.hidden_size)
    translators = _random_translators(layers, width)
    write_lens(tmp_path / "lens", translators, _config(handle, decoding))
    with caplog.at_level(logging.WARNING):
        theirs = TheirLens.from_model_and_pretrained(net, str(tmp_path / "lens")).eval()
    assert not [r for r in caplog.records if "hash" in r.getMessage()]  # the same unembedding, by their hash

    inputs = model_inputs(handle, handle.tokenizer(), TEXTS, 32)
    ours = translated_head(decoding.head, translators)
    with torch.no_grad():
        out = net(**inputs, output_hidden_states=True)
        hidden = out.hidden_states
        for j in range(layers):
            np.testing.assert_allclose(ours(hidden[j], j).numpy(), theirs(hidden[j], idx=j).numpy(), rtol=1e-5,
                                       atol=2e-4)
        evaluated = _their_eval(theirs, hidden, out.logits, inputs["input_ids"])
    got = torch_lens(decoding, inputs, list(range(layers + 1)), 3, hidden, head=ours, divergence=True)
    real = inputs["attention_mask"].numpy().astype(bool)
    has_next = real & np.concatenate([real[:, 1:], np.zeros_like(real[:, :1])], axis=1)
    final_top1 = out.logits.argmax(-1).numpy()
    for j, (kl, ce) in evaluated.items():
        kl = kl.numpy()
        assert kl[real].max() > 0.05  # not vacuous: the layer's decoded distribution is far from the final one
        np.testing.assert_allclose(got.kl[j][real], kl[real], rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(-got.logprob[j][has_next], ce.numpy()[has_next[:, :-1]], rtol=2e-4, atol=2e-5)
        with torch.no_grad():
            their_top1 = theirs(hidden[j], idx=j).argmax(-1).numpy()
        assert np.array_equal(got.topk_ids[j, :, :, 0][real], their_top1[real])
    assert np.array_equal(got.topk_ids[layers, :, :, 0][real], final_top1[real])
    assert np.allclose(got.kl[layers][real], 0.0, atol=1e-9)

    if family == "gpt2":  # the tuned lens's ONNX graph: the same figures from ONNX Runtime
        from layerscope.decoding.lens_onnx import export_lens, lens_of_export
        from layerscope.export.exporter import export_model
        from layerscope.model.source import resolve_source

        export = tmp_path / "export"
        export_model(resolve_source(str(path)), export, pooled=["mean"])
        lens = read_lens(tmp_path / "lens")
        meta = export_lens(export, 3, tuned=lens)
        assert meta.tuned.params_sha256 == lens.params_sha256 and meta.parity.max_kl_diff < 1e-5
        exported = ModelHandle.resolve(export)
        feed = {n: t.numpy() for n, t in inputs.items()}
        rank, ids, _, kl_onnx, logprob_onnx = lens_of_export(exported, 3, feed, tuned=lens, divergence=True)
        for j, (kl, ce) in evaluated.items():
            np.testing.assert_allclose(kl_onnx[j][real], kl.numpy()[real], rtol=2e-4, atol=2e-5)
            np.testing.assert_allclose(-logprob_onnx[j][has_next], ce.numpy()[has_next[:, :-1]], rtol=2e-4,
                                       atol=2e-5)
            assert np.array_equal(ids[j, :, :, 0][real], got.topk_ids[j, :, :, 0][real])
        from layerscope.integrity import verify_path

        assert verify_path(export)[1] == []  # layerscope verify checksums the tuned graph too
        graph = export / meta.file
        graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
        assert any(meta.file in line for line in verify_path(export)[1])


def test_a_lens_tuned_lens_saved_reads_into_ours(peaked, tmp_path):
    """Catches: their state dict's names or Linear's (out, in) layout misread, their config.json's fields
    misread, or our unembed_hash computed differently from theirs (a lens of this very model then refused as
    another model's)."""
    from tuned_lens import TunedLens as TheirLens

    path, net, decoding, handle = peaked("gpt2")
    theirs = TheirLens.from_model(net)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in theirs.layer_translators:
            t.weight.copy_(torch.randn(t.weight.shape, generator=generator) * 0.1)
            t.bias.copy_(torch.randn(t.bias.shape, generator=generator) * 0.1)
    theirs.save(tmp_path / "theirs")
    lens = read_lens(tmp_path / "theirs")
    assert lens.record is None and lens.config.num_hidden_layers == decoding.num_layers
    assert lens.config.unembed_hash == unembedding_hash(head_unembedding(decoding))
    lens.check_fits(handle.manifest, unembedding_hash=unembedding_hash(head_unembedding(decoding)))
    for i, t in enumerate(theirs.layer_translators):
        assert np.array_equal(lens.translators.weight[i], t.weight.detach().numpy())
        assert np.array_equal(lens.translators.bias[i], t.bias.detach().numpy())
    inputs = model_inputs(handle, handle.tokenizer(), TEXTS, 32)
    ours = translated_head(decoding.head, lens.translators)
    with torch.no_grad():
        hidden = net(**inputs, output_hidden_states=True).hidden_states
        for j in range(decoding.num_layers):
            np.testing.assert_allclose(ours(hidden[j], j).numpy(), theirs(hidden[j], idx=j).numpy(), rtol=1e-5,
                                       atol=2e-4)
    # the same file as plain numbers: the translator applied by hand
    h = hidden[1][0].double().numpy()
    by_hand = h + h @ lens.translators.weight[1].astype(np.float64).T + lens.translators.bias[1]
    np.testing.assert_allclose(lens.translators.apply(hidden[1][0].numpy(), 1), by_hand, rtol=1e-6, atol=1e-6)


class _NotATensor:
    pass


def test_a_params_file_naming_more_than_tensors_is_refused_before_torch_reads_it(tmp_path, monkeypatch):
    """Catches: params.pt handed to torch.load (or pickle) before its globals were looked at; a legacy
    (non-zip) file or an edited config read as a lens."""
    config = LensConfig("m", 4, 1)
    folder = tmp_path / "lens"
    write_lens(folder, Translators.identity(1, 4), config)
    assert read_lens(folder).translators.weight.shape == (1, 4, 4)
    torch.save({"0.weight": torch.zeros(4, 4), "0.bias": torch.zeros(4), "x": _NotATensor()}, folder / "params.pt")
    read = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: read.append(a) or {})
    with pytest.raises(InputError, match="names .*_NotATensor, which a state dict of tensors never does"):
        read_lens(folder)
    (folder / "params.pt").write_bytes(b"\x80\x02}q\x00.")  # a bare pickle, no zip archive
    with pytest.raises(InputError, match="not a torch zip archive"):
        read_lens(folder)
    assert read == []
    monkeypatch.undo()
    write_lens(folder, Translators.identity(2, 4), LensConfig("m", 4, 2))
    (folder / "config.json").write_text('{"base_model_name_or_path": "m", "d_model": 4, "num_hidden_layers": 3}')
    with pytest.raises(InputError, match="lacks 2.bias, 2.weight: config.json says 3 translators of width 4"):
        read_lens(folder)
    (folder / "config.json").write_text('{"base_model_name_or_path": "m", "d_model": "4", "num_hidden_layers": 2}')
    with pytest.raises(InputError, match="d_model is '4', not a int"):
        read_lens(folder)


def test_a_lens_of_another_width_or_depth_is_one_line(peaked, tmp_path):
    """Catches: a lens made for another model decoding this one (shapes that broadcast, or the last
    translators silently unused)."""
    _, _, decoding, handle = peaked("gpt2")
    width, layers = int(handle.manifest.hidden_size), decoding.num_layers
    for name, (n, d), said in (("wide", (layers, width * 2), f"is {width * 2} wide, the model's layers are {width}"),
                               ("deep", (layers + 1, width), f"translators for {layers + 1} layers, the model has "
                                                             f"{layers}")):
        write_lens(tmp_path / name, Translators.identity(n, d), LensConfig("m", d, n))
        lens = read_lens(tmp_path / name)
        with pytest.raises(InputError, match=said) as err:
            lens.check_fits(handle.manifest)
        assert "\n" not in str(err.value)
    write_lens(tmp_path / "other", Translators.identity(layers, width),
               LensConfig("m", width, layers, unembed_hash="0" * 64))
    with pytest.raises(InputError, match="trained for another unembedding"):
        read_lens(tmp_path / "other").check_fits(handle.manifest, unembedding_hash=unembedding_hash(
            head_unembedding(decoding)))
