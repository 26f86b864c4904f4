"""Writing a state at a layer and running the layers after it (engines/resume.py), on ort, ov and torch: held to
the test's own forward hooks on the Hugging Face model, every layer, on right- and left-padded batches; the
derived graphs' cache and record; bad input is one line before any graph is made."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.errors import InputError
from layerscope.model.tokenize import Batch

FAMILIES = ("bert", "gpt2", "qwen2")
ENGINES = ("ort", "ov", "torch")
TEXTS = ["The cat sat on the mat.", "Hi", "Water boils at 100 degrees Celsius at sea level."]
# where each family's blocks are, named here (not found by layerscope's code)
BLOCKS = {"bert": "encoder.layer", "gpt2": "h", "qwen2": "layers"}


@pytest.fixture(scope="module")
def exports(tiny_export):
    return {family: tiny_export(family) for family in FAMILIES}


def _left(batch: Batch) -> Batch:
    """The batch left-padded: each row's tokens moved to its right end, positions counted from its first token."""
    mask = batch.mask
    shift = mask.shape[1] - mask.sum(axis=1)
    inputs = {k: np.stack([np.roll(r, int(s)) for r, s in zip(v, shift)]) for k, v in batch.inputs.items()}
    if "position_ids" in inputs:
        inputs["position_ids"] = np.clip(np.cumsum(inputs["attention_mask"], axis=1) - 1, 0, None)
    return Batch(inputs=inputs, index=batch.index, truncated=batch.truncated)


def _hooked(model_dir, family: str, batch: Batch, layer: int, state: np.ndarray) -> list[np.ndarray]:
    """Every hidden state of the plain Hugging Face model whose block ``layer + 1`` reads ``state`` instead of its
    input (a forward pre-hook written here)."""
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    blocks = net.get_submodule(BLOCKS[family])
    given = torch.from_numpy(state)

    def swap(module, args, kwargs):
        if args:
            return (given, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": given}

    handle = blocks[layer].register_forward_pre_hook(swap, with_kwargs=True) if layer < len(blocks) else None
    try:
        with torch.inference_mode():
            out = net(**{k: torch.from_numpy(v) for k, v in batch.inputs.items()}, output_hidden_states=True)
    finally:
        if handle is not None:
            handle.remove()
    return [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_written_state_runs_the_later_layers_as_hooks_on_the_model_do(family, exports, tiny_model):
    """Every layer j, both paddings, every engine: layers j..L from a state written at j (the model's own state
    moved at every real token) equal the hooked Hugging Face model's; the model's own state written back gives
    the full run's layers again."""
    export = exports[family]
    rng = np.random.default_rng(0)
    engines = {name: create_engine(name, str(export) if name != "torch" else str(tiny_model(family)))
               for name in ENGINES}
    right = engines["ort"].encoder()(TEXTS)
    num_layers = engines["ort"].manifest.num_layers
    for side, batch in (("right", right), ("left", _left(right))):
        real = batch.mask.astype(bool)
        own = engines["ort"].run_tokens(batch, [str(i) for i in range(num_layers + 1)])
        for layer in range(num_layers + 1):
            state = (own[layer] + rng.normal(0, 0.5, own[layer].shape) * real[..., None]).astype(np.float32)
            want = _hooked(tiny_model(family), family, batch, layer, state)
            later = list(range(layer, num_layers + 1))
            for name, engine in engines.items():
                got = engine.resume(batch, layer, state, later)
                np.testing.assert_array_equal(got[0], state)  # layer j itself is the state written
                for k, g in zip(later[1:], got[1:]):
                    np.testing.assert_allclose(g[real], want[k][real], atol=2e-4, rtol=0,
                                               err_msg=f"{family} {name} {side} layer {layer} -> {k}")
                back = engine.resume(batch, layer, own[layer], [num_layers])[0]
                np.testing.assert_allclose(back[real], own[num_layers][real], atol=2e-5, rtol=0,
                                           err_msg=f"{family} {name} {side} own state at {layer}")
    notes = engines["ov"].info.notes
    assert any(n.startswith("resume at layer 0") for n in notes), notes
    for engine in engines.values():
        engine.close()


def test_resume_graphs_are_cached_checked_and_made_again(exports, tmp_path):
    """A graph is recorded with its source's hash and its data file; reused while they hold; made again when its
    record is tampered with, its own bytes change, or the source graph is rewritten in place."""
    import shutil

    export = tmp_path / "gpt2"
    shutil.copytree(exports["gpt2"], export)
    engine = create_engine("ort", str(export))
    batch = engine.encoder()(TEXTS[:2])
    state = engine.run_tokens(batch, ["1"])[0]
    first = engine.resume(batch, 1, state)[0]
    record = json.loads((export / "model.from-1.json").read_text())
    assert record["layer"] == 1 and record["data"] == "model.resume.data"
    assert record["inputs"][0] != "input_ids" or "hidden_states.1" in record["inputs"]
    assert record["check"]["max_abs"] <= record["check"]["tolerance_abs"]
    assert "with other token ids" in record["check"]["outputs"]
    owned = json.loads((export / ".layerscope.json").read_text())
    assert {"model.from-1.onnx", "model.from-1.json", "model.resume.data"} <= set(owned["owned"])
    engine.close()

    def fresh() -> str:
        eng = create_engine("ort", str(export))
        got = eng.resume(batch, 1, state)[0]
        np.testing.assert_array_equal(got, first)
        note = next(n for n in eng.info.notes if n.startswith("resume at layer 1"))
        eng.close()
        return note

    assert fresh().endswith("cached)")
    (export / "model.from-1.json").write_text(json.dumps({**record, "layer": "1"}))
    assert not fresh().endswith("cached)")  # a record of the wrong type: made again
    with open(export / "model.from-1.onnx", "ab") as f:
        f.write(b"\0")
    assert not fresh().endswith("cached)")  # the graph's bytes changed
    import onnx

    from layerscope.hashing import file_sha256

    model = onnx.load(str(export / "model.onnx"))
    onnx.helper.set_model_props(model, {"edited": "yes"})
    onnx.save(model, str(export / "model.onnx"))
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["onnx_sha256"] = file_sha256(export / "model.onnx")  # as an export rewritten in place records
    (export / "manifest.json").write_text(json.dumps(manifest))
    assert not fresh().endswith("cached)")  # the source changed
    assert json.loads((export / "model.from-1.json").read_text())["source_sha256"] != record["source_sha256"]


@pytest.mark.parametrize("engine_name", ENGINES)
def test_bad_writes_are_one_line_before_any_graph_is_made(engine_name, tiny_export, tiny_model, tmp_path):
    export = tiny_export("bert", to=tmp_path / "bert")  # a fresh copy: no derived graph in it yet
    engine = create_engine(engine_name, str(export) if engine_name != "torch" else str(tiny_model("bert")))
    batch = engine.encoder()(TEXTS[:2])
    width = engine.manifest.hidden_size
    state = np.zeros((*batch.mask.shape, width), np.float32)
    cases = {
        "outside the model": (3, state), "outside the model ": (-1, state), "not a layer number": ("raw", state),
        f"width {width + 1}": (1, np.zeros((*batch.mask.shape, width + 1), np.float32)),
        "does not fit the batch": (1, np.zeros((1, batch.mask.shape[1], width), np.float32)),
    }
    for said, (layer, value) in cases.items():
        with pytest.raises(InputError) as err:
            engine.resume(batch, layer, value)
        assert said.strip() in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(InputError, match="gives layers 1..2, not 0"):
        engine.resume(batch, 1, state, [0])
    assert not list(export.glob("model.from-*")) and not (export / "model.resume.data").exists()
    engine.close()
