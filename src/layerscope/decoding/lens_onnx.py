"""The logit lens inside the ONNX graph: per-layer rank and top-k outputs for the fast engines.

``export_lens(export_dir, k)`` traces :func:`layerscope.decoding.lens.lens_outputs` (the same code
the torch path runs) for layers ``0..L`` into a small graph whose inputs are named like the
model graph's tensors (``hidden_states.i``, ``input_ids``, ``attention_mask``), then appends its
nodes to a copy of ``model.onnx`` as ``lens-k{k}.onnx`` with three extra outputs:

* ``lens.rank``        int64 ``[L+1, batch, seq]`` (1 = top, 0 = no target)
* ``lens.topk_ids``    int64 ``[L+1, batch, seq, k]``
* ``lens.topk_probs``  double ``[L+1, batch, seq, k]`` (softmax in float64)

Full vocabulary logits never leave the graph.  A sidecar ``lens-k{k}.json`` records the head,
``k``, the file's sha256 and the parity against torch measured at export time.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError, InputError
from layerscope.export import external
from layerscope.vocab.outputs import hidden_outputs

OUTPUTS = ("lens.rank", "lens.topk_ids", "lens.topk_probs")
# Logits this close (relative to the target's, at least this absolute) are ties: ONNX Runtime and
# torch sum in different orders, so near-equal logits may swap places without either being wrong.
RANK_TIE_REL_TOL = 1e-5
PROBABILITIES = "float64"  # the precision of lens.topk_probs, recorded in the sidecar
PARITY_TEXTS = ["The cat sat on the mat.", "Layers refine hidden states, one block at a time, in 2024.", "Hi"]


def lens_file(k: int) -> str:
    return f"lens-k{int(k)}.onnx"


def _graph_module(model, k: int):
    import torch

    from layerscope.decoding.lens import lens_outputs

    n = model.num_layers + 1
    decoder = model.family.kind == "decoder"

    class LensGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = model.head

        def forward(self, *args):
            hidden, input_ids, mask = list(args[:n]), args[n], args[n + 1]
            return lens_outputs(self.head, hidden, list(range(n)), input_ids, mask, k, decoder)

    return LensGraph().eval()


def _trace_head(model, k: int, hidden_size: int, opset: int, path: Path) -> None:
    import torch

    n = model.num_layers + 1
    b, s = 2, 5
    dummy = [torch.randn(b, s, hidden_size) for _ in range(n)]
    ids = torch.randint(0, 3, (b, s))
    mask = torch.ones(b, s, dtype=torch.int64)
    names = hidden_outputs(model.num_layers) + ["input_ids", "attention_mask"]
    axes = {nm: {0: "batch_size", 1: "sequence_length"} for nm in names}
    axes.update({o: {1: "batch_size", 2: "sequence_length"} for o in OUTPUTS})
    try:
        torch.onnx.export(_graph_module(model, k), tuple(dummy + [ids, mask]), str(path), input_names=names,
                          output_names=list(OUTPUTS), dynamic_axes=axes, opset_version=opset, dynamo=False)
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"could not export the lens head to ONNX: {str(exc).splitlines()[0][:300]}") from exc


def _append(model_proto, head_proto, keep: set[str], prefix: str = "lens/") -> None:
    """Append the head graph's nodes and initializers to the model graph, prefixing its own names."""

    def rn(name: str) -> str:
        return name if (not name or name in keep) else prefix + name

    g = model_proto.graph
    for init in head_proto.graph.initializer:
        init.name = rn(init.name)
        g.initializer.append(init)
    for node in head_proto.graph.node:
        node.name = prefix + (node.name or node.op_type)
        for i, nm in enumerate(node.input):
            node.input[i] = rn(nm)
        for i, nm in enumerate(node.output):
            node.output[i] = rn(nm)
        g.node.append(node)
    for out in head_proto.graph.output:
        g.output.append(out)


def export_lens(export_dir: str | Path, k: int = 5, *, check: bool = True) -> dict[str, Any]:
    """Write ``lens-k{k}.onnx`` (+ sidecar json) next to ``model.onnx``; returns the sidecar dict. The files
    join the export's record of layerscope's files (``--force`` may replace them)."""
    from layerscope.ownership import writing

    with writing(export_dir, "export") as wrote:
        return _export_lens(export_dir, k, wrote, check=check)


def _export_lens(export_dir: str | Path, k: int, wrote, *, check: bool = True) -> dict[str, Any]:
    import onnx

    from layerscope.decoding.heads import load_decoding_model
    from layerscope.export.graph import opset_of
    from layerscope.hashing import file_sha256
    from layerscope.model.handle import ModelHandle

    if k < 1:
        raise InputError(f"--lens-k must be at least 1, not {k}")
    handle = ModelHandle.resolve(export_dir)
    if not handle.is_export:
        raise InputError(f"{export_dir} is not an export dir; run layerscope export first")
    vocab = int(handle.manifest.vocab_size)
    if k > vocab:
        raise InputError(f"--lens-k {k} is larger than the vocabulary ({vocab})")
    model = load_decoding_model(handle)
    # The structure only: an external-data export keeps its weights in model.onnx_data, which the
    # lens graph (saved in the same directory) refers to as they are, without a copy.
    base = onnx.load(str(handle.onnx_path), load_external_data=False)
    big = external.uses_external_data(base)
    opset = opset_of(base)
    out_dir = Path(handle.export_dir)
    with tempfile.TemporaryDirectory() as tmp:
        head_path = Path(tmp) / "head.onnx"
        _trace_head(model, k, handle.manifest.hidden_size, opset, head_path)
        head = onnx.load(str(head_path))
    keep = {*hidden_outputs(model.num_layers), "input_ids", "attention_mask", *OUTPUTS}
    _append(base, head, keep)
    target = out_dir / lens_file(k)
    head_names = {i.name for i in head.graph.initializer}
    lens_data = external.data_file(target.name)
    tmp_file = target.with_suffix(".onnx.tmp")
    wrote.add(target.name, tmp_file.name, lens_data, target.stem + ".json")  # named before they are written
    if big:  # the head's own weights (the unembedding: vocab x hidden) go to lens-k{k}.onnx_data
        external.externalize([i for i in base.graph.initializer if i.name in head_names], out_dir, lens_data)
    elif external.inline_bytes(base) >= external.EXTERNAL_DATA_BYTES:  # model + head cross the 2 GiB line
        external.externalize(list(base.graph.initializer), out_dir, lens_data)
    onnx.save(base, str(tmp_file))
    os.replace(tmp_file, target)
    external.check_graph(target)
    sidecar = {"file": target.name, "k": k, "head": model.info.to_dict(), "outputs": list(OUTPUTS),
               "probabilities": PROBABILITIES, "sha256": file_sha256(target),
               "model_onnx_sha256": handle.manifest.onnx_sha256}
    if check:
        sidecar["parity"] = lens_parity(handle, model, target, k)
        if sidecar["parity"]["rank_mismatch_fraction"] > 0.001 or sidecar["parity"]["max_prob_diff"] > 1e-4:
            target.unlink()
            (out_dir / external.data_file(target.name)).unlink(missing_ok=True)
            raise ExportError(f"the lens graph does not match torch ({sidecar['parity']}); nothing was kept")
    (out_dir / (target.stem + ".json")).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
    return sidecar


def read_sidecar(handle, k: int) -> dict[str, Any] | None:
    path = Path(handle.export_dir) / (Path(lens_file(k)).stem + ".json")
    if not path.exists() or not (Path(handle.export_dir) / lens_file(k)).exists():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("model_onnx_sha256") != handle.manifest.onnx_sha256:
        return None  # made for an earlier model.onnx
    if meta.get("probabilities") != PROBABILITIES:
        return None  # a graph whose softmax ran in another precision
    return meta


def run_onnx_lens(session, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    feed = {i.name: np.ascontiguousarray(inputs[i.name]) for i in session.get_inputs()}
    r, ids, p = session.run(list(OUTPUTS), feed)
    return np.asarray(r), np.asarray(ids), np.asarray(p, dtype=np.float64)


def lens_parity(handle, model, path: Path, k: int, texts: list[str] | None = None) -> dict[str, float]:
    """ONNX Runtime (CPU) vs the torch computation on a padded batch: rank and top-k agreement."""
    from layerscope.decoding.heads import model_inputs
    from layerscope.decoding.lens import rank_bands, torch_lens
    from layerscope.engines.ort import make_session

    inputs = model_inputs(handle, handle.tokenizer(), texts or PARITY_TEXTS, 64)
    layers = list(range(model.num_layers + 1))
    hidden, reference = _reference_hidden(handle, model, inputs)
    ref = torch_lens(model, inputs, layers, k, hidden)
    session = make_session(path, "CPUExecutionProvider")
    r, ids, p = run_onnx_lens(session, {n: t.numpy() for n, t in inputs.items()})
    del session
    valid = ref.mask.astype(bool)
    lo, hi = rank_bands(model, inputs, layers, RANK_TIE_REL_TOL, hidden)
    outside = (r < lo) | (r > hi)
    rank_mis = float(outside[:, valid].mean())
    top1_mis = float((ids[:, valid, 0] != ref.topk_ids[:, valid, 0]).mean())
    return {"rank_mismatch_fraction": rank_mis, "rank_tie_rel_tol": RANK_TIE_REL_TOL,
            "rank_exact_mismatch_fraction": float((r[:, valid] != ref.rank[:, valid]).mean()),
            "top1_mismatch_fraction": top1_mis,
            "max_prob_diff": float(np.abs(p[:, valid] - ref.topk_probs[:, valid]).max()),
            "reference_hidden_states": reference}


def _reference_hidden(handle, model, inputs):
    """The hidden states the torch head decodes for the check, and where they came from.

    The torch base model when the source checkpoint is there; otherwise the export's own graph
    (``model.onnx``, itself checked against torch at export time), so the check still covers the
    appended head and its rank / top-k arithmetic.
    """
    import torch

    from layerscope.decoding.lens import base_hidden_states
    from layerscope.engines.ort import make_session

    if model.has_base:
        try:
            return base_hidden_states(model, inputs), "torch base model (source checkpoint)"
        except InputError:
            pass
    session = make_session(handle.onnx_path, "CPUExecutionProvider")
    names = [f"hidden_states.{i}" for i in range(model.num_layers + 1)]
    feed = {i.name: np.ascontiguousarray(inputs[i.name].numpy()) for i in session.get_inputs()}
    outs = session.run(names, feed)
    return [torch.from_numpy(np.asarray(o, dtype=np.float32)) for o in outs], f"{handle.onnx_path.name} (ONNX Runtime)"
