"""The decoding head as logits, for analyses that write states (patching, steering, the Patchscope).

The logit lens (decoding/lens_onnx.py) needs only ranks and top-k ids, so its graph hands back nothing else; an
intervention reads a logit difference, a token's probability or a whole next-token distribution. This module
gives both engines' kinds one reader, ``head_reader(engine)`` -> ``HeadReader`` with ``logits(h, layer)``:
float32 ``[n, vocabulary]`` of hidden states ``h`` (``[n, hidden]``) of layer ``layer``, through the head the lens
reads (decoding/heads.py: the model's MLM or causal-LM head, or the tied word embeddings), the final norm applied
below the last layer where the head has one.

* the PyTorch reference engine: the head in PyTorch (``load_decoding_model``, the export's stored head);
* the engines that run ONNX graphs: ``head-logits.onnx``, traced once per export from the same torch head
  (input ``head.hidden`` ``[n, hidden]``; outputs ``head.logits``, the head as it reads layer L, and
  ``head.logits_below``, as it reads a layer below L), run on the engine's own runtime (``Engine.open_graph``).
  Its weights are not copied: each equal to a tensor of the export's ``lm_head.safetensors`` points at it, as
  the lens graph's do. ``head-logits.json`` (model/head_record.py) records the graph's sha256 and that of the
  weights it reads, the ``model.onnx`` it was made for and its largest difference from the torch head on the
  parity texts' states; a record whose claims do not hold (the rule of model/derived.py) makes it again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layerscope.errors import ExportError
from layerscope.model.head_record import HEAD_FILE, HEAD_FORMAT, RECORD_FILE, HeadRecord, load_head_record

INPUT = "head.hidden"
LAST, BELOW = "head.logits", "head.logits_below"
# the graph against the torch head: |diff| of the logits within this much of their largest magnitude
PARITY_REL = 1e-4


def _graph_module(model):
    import torch

    last = model.num_layers

    class HeadGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = model.head

        def forward(self, hidden):
            return self.head(hidden, last), self.head(hidden, 0)

    return HeadGraph().eval()


def export_head(export_dir: str | Path, *, say: Callable[[str], None] = lambda _m: None) -> HeadRecord:
    """Write ``head-logits.onnx`` and its record beside ``model.onnx`` (recorded as layerscope's files); returns the
    record. The torch head is loaded from the export (its stored head) or the checkpoint it was made from."""
    from layerscope.ownership import writing

    with writing(export_dir, "export") as wrote:
        return _export_head(Path(export_dir), wrote, say)


def _export_head(export_dir: Path, wrote, say) -> HeadRecord:
    import onnx
    import torch

    from layerscope.decoding.heads import load_decoding_model
    from layerscope.decoding.lens_onnx import _share_stored_head
    from layerscope.export import external
    from layerscope.export.graph import opset_of
    from layerscope.hashing import file_sha256
    from layerscope.jsonfile import write_json_atomic
    from layerscope.model.derived import source_sha256
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(export_dir)
    manifest = handle.manifest
    say(f"tracing the decoding head of {export_dir.name} as logits (once)")
    model = load_decoding_model(handle)
    opset = opset_of(onnx.load(str(handle.onnx_path), load_external_data=False))
    # traced beside the export, not in /tmp: a large vocabulary's head is GBs, more than a small /tmp holds
    with tempfile.TemporaryDirectory(dir=export_dir, prefix=".head-trace-") as tmp:
        path = Path(tmp) / "head.onnx"
        try:
            torch.onnx.export(_graph_module(model), (torch.randn(3, manifest.hidden_size),), str(path),
                              input_names=[INPUT], output_names=[LAST, BELOW],
                              dynamic_axes={INPUT: {0: "n"}, LAST: {0: "n"}, BELOW: {0: "n"}}, opset_version=opset,
                              dynamo=False, do_constant_folding=False)
        except Exception as exc:  # torch.onnx raises many untyped errors
            raise ExportError(f"could not export the decoding head to ONNX: {str(exc).splitlines()[0][:300]}") from exc
        proto = onnx.load(str(path))
    target = export_dir / HEAD_FILE
    data = external.data_file(target.name)
    tmp_file = target.with_name(target.name + ".tmp")
    wrote.add(target.name, tmp_file.name, data, RECORD_FILE)  # named before they are written
    _share_stored_head(proto, export_dir, manifest)
    external.externalize(list(proto.graph.initializer), export_dir, data)
    onnx.save(proto, str(tmp_file))
    os.replace(tmp_file, target)
    max_abs, scale = _parity(handle, model, target)
    if not max_abs <= PARITY_REL * max(1.0, scale):
        target.unlink()
        (export_dir / data).unlink(missing_ok=True)
        raise ExportError(f"the head graph's logits differ from the torch head's by {max_abs:.3g}; nothing was kept")
    record = HeadRecord(HEAD_FORMAT, target.name, file_sha256(target), source_sha256(target), manifest.onnx_sha256,
                        model.info.kind, model.info.description, bool(model.info.final_norm), int(manifest.vocab_size), max_abs, scale)
    write_json_atomic(export_dir / RECORD_FILE, record.to_dict())
    return record


def _parity(handle, model, path: Path) -> tuple[float, float]:
    """Largest |graph - torch| of the logits (and the largest |logit|) on the export's states of the parity texts."""
    import torch

    from layerscope.decoding.lens_onnx import PARITY_TEXTS
    from layerscope.engines.ort_session import make_session
    from layerscope.model.tokenize import Encoder
    from layerscope.vocab.outputs import hidden_outputs

    batch = Encoder(handle.tokenizer(), list(handle.manifest.inputs), 64)(PARITY_TEXTS)
    graph = make_session(handle.onnx_path, "CPUExecutionProvider")
    feed = {i.name: np.ascontiguousarray(batch.inputs[i.name]) for i in graph.get_inputs()}
    states = graph.run(hidden_outputs(model.num_layers), feed)
    del graph
    real = batch.mask.astype(bool)
    head = make_session(path, "CPUExecutionProvider")
    worst = scale = 0.0
    for layer in (0, model.num_layers):
        h = np.ascontiguousarray(np.asarray(states[layer], dtype=np.float32)[real])
        got = head.run([LAST if layer == model.num_layers else BELOW], {INPUT: h})[0]
        with torch.inference_mode():
            want = model.logits(torch.from_numpy(h), layer).float().numpy()
        worst = max(worst, float(np.max(np.abs(got - want))))
        scale = max(scale, float(np.max(np.abs(want))))
    return worst, scale


def read_head_record(export_dir: Path, manifest) -> HeadRecord | None:
    """The export's head graph record where every claim holds (model/derived.py ``head_problem``), else None:
    the graph is made again."""
    from layerscope.errors import ManifestError
    from layerscope.model.derived import head_problem

    record = load_head_record(export_dir)
    if record is None:
        return None
    try:
        return None if head_problem(export_dir, manifest, record) else record
    except ManifestError:  # its graph names weights outside the export
        return None


class HeadReader:
    """Logits of hidden states through the model's decoding head (see the module docstring)."""

    def __init__(self, logits: Callable[[np.ndarray, bool], np.ndarray], num_layers: int, info: dict[str, Any],
                 computed_by: str):
        self._logits = logits
        self.num_layers = num_layers
        self.info = info  # the head: kind, description, final_norm_below_last
        self.computed_by = computed_by

    def logits(self, hidden: np.ndarray, layer: int) -> np.ndarray:
        """float32 ``[n, vocabulary]`` of ``hidden`` (``[n, hidden]``) read as layer ``layer``'s states."""
        h = np.ascontiguousarray(np.asarray(hidden, dtype=np.float32).reshape(-1, np.shape(hidden)[-1]))
        if len(h) == 0:
            return np.zeros((0, 0), np.float32)
        return np.asarray(self._logits(h, int(layer) >= self.num_layers), dtype=np.float32)


def head_reader(engine, say: Callable[[str], None] = lambda _m: None) -> HeadReader:
    """The head of ``engine``'s model as logits: in PyTorch on the reference engine, else through the head graph
    (made once per export) on the engine's runtime."""
    from layerscope.engines.registry import engine_spec

    handle = engine.model
    num_layers = handle.manifest.num_layers
    if engine_spec(engine.info.name).reference:
        import torch

        from layerscope.decoding.heads import load_decoding_model

        model = load_decoding_model(handle)

        def torch_logits(h: np.ndarray, last: bool) -> np.ndarray:
            with torch.inference_mode():
                return model.logits(torch.from_numpy(h), num_layers if last else 0).float().numpy()

        info = {"kind": model.info.kind, "description": model.info.description,
                "final_norm_below_last": bool(model.info.final_norm)}
        return HeadReader(torch_logits, num_layers, info, "the head in PyTorch")
    from layerscope.export.open import ensure_export

    handle = ensure_export(handle)
    export_dir = Path(handle.export_dir)
    record = read_head_record(export_dir, handle.manifest)
    if record is None:
        record = export_head(export_dir, say=say)
    session = engine.open_graph(export_dir / record.file)

    def graph_logits(h: np.ndarray, last: bool) -> np.ndarray:
        return session.run([LAST if last else BELOW], {INPUT: h})[0]

    info = {"kind": record.kind, "description": record.description,
            "final_norm_below_last": record.final_norm_below_last}
    return HeadReader(graph_logits, num_layers, info, f"{record.file} on the engine's runtime")
