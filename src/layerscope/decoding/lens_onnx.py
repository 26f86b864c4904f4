"""The logit lens as a small ONNX graph, the decoding head alone, for the engines that run ONNX graphs.

``export_lens(export_dir, k)`` traces :func:`layerscope.decoding.lens.lens_outputs` (the same code the torch
path runs) for layers ``0..L`` into ``lens-k{k}.onnx``. Its inputs are every layer's hidden states at a run of
positions (``hidden_states.i``, ``[1, positions, hidden]``, what the export's own graph outputs), each
position's target id (``lens.target``) and whether it has one (``lens.valid``); its outputs:

* ``lens.rank``        int64 ``[L+1, 1, positions]`` (1 = top, 0 = no target)
* ``lens.topk_ids``    int64 ``[L+1, 1, positions, k]``
* ``lens.topk_probs``  double ``[L+1, 1, positions, k]`` (softmax in float64)
* ``lens.kl``          double ``[L+1, 1, positions]``: ``KL(final || layer)`` in nats, the final distribution the
  model's own output (layer ``L`` decoded)
* ``lens.logprob``     double ``[L+1, 1, positions]``: the target's log-probability (0 where there is none)

A tuned lens's graph (``export_lens(..., tuned=lens)``, ``lens-tuned-{id}-k{k}.onnx`` with ``id`` the first 12 hex
digits of its translators' sha256) is the same trace with each layer's translator before the head
(decoding/tuned_lens.py ``translated_head``): layer ``L`` has none, so its final distribution is the model's own.
Its sidecar records which translators it holds, so a retrained lens gets a graph of its own.

The graph holds the head only, and its weights are not copied: each initializer equal to a tensor of the
export's ``lm_head.safetensors`` is external data pointing at that tensor's bytes (an export without a
stored head writes the head's weights once, to ``lens-k{k}.onnx_data``). ``onnx_lens`` runs it over the real
tokens of a batch a run of positions at a time, so the logits held at once (positions x layers x vocabulary)
stay under ``HEAD_BYTES`` however long the batch; padding is never decoded. A sidecar ``lens-k{k}.json``
records the head, ``k``, the file's sha256 and the parity against torch measured at export time.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from layerscope.errors import ExportError, InputError
from layerscope.export import external
from layerscope.model.lens_record import LensHead, LensParity, LensSidecar, TunedSource, graph_stem, sidecar_name
from layerscope.vocab.outputs import hidden_outputs

OUTPUTS = ("lens.rank", "lens.topk_ids", "lens.topk_probs", "lens.kl", "lens.logprob")
DECODED = OUTPUTS[:3]  # what the logit lens's tables read; the last two are the divergence figures
TARGET, VALID = "lens.target", "lens.valid"
HEAD_BYTES = 256 * 2**20  # the head's logits held at once: positions x layers x vocabulary x LOGIT_BYTES
# bytes held per logit during a run: ONNX Runtime keeps every layer's float32 logits and tensors beside them until
# the run ends. Measured on a synthetic head (vocabulary 50,257, 12 layers, warm session: peak RSS over positions x
# layers x vocabulary): 4.75 bytes without the KL and log-probability outputs, 6.3 with them (their dot product a
# float32 matrix product: no vocabulary-wide product per layer); this budget keeps the margin the earlier one had
# (8 for 4.75). The positions per run matter for speed: a run reads the head's weights once per layer
LOGIT_BYTES = 11
# multiply-adds per run of the head (positions x layers x vocabulary x hidden): the progress count advances once
# per run, so a run stays seconds long at real size (GPT-2-medium: ~50 positions, not a few hundred)
HEAD_MACS = 2**36
# Logits this close (relative to the target's, at least this absolute) are ties: ONNX Runtime and
# torch sum in different orders, so near-equal logits may swap places without either being wrong.
RANK_TIE_REL_TOL = 1e-5
PROBABILITIES = "float64"  # the precision of lens.topk_probs, recorded in the sidecar
PARITY_TEXTS = ["The cat sat on the mat.", "Layers refine hidden states, one block at a time, in 2024.", "Hi"]


def lens_file(k: int, tuned=None) -> str:
    """The lens graph's file: ``lens-k{k}.onnx``, or the graph of the tuned lens ``tuned`` (a ``TunedLens``)."""
    return graph_stem(k, tuned_id(tuned)) + ".onnx"


def tuned_id(tuned) -> str | None:
    """A tuned lens's id in file names (its translators' sha256, 12 hex digits), None for the logit lens."""
    return None if tuned is None else tuned.params_sha256[:12]


def _graph_module(model, k: int, head=None):
    import torch

    from layerscope.decoding.lens import lens_outputs

    n = model.num_layers + 1

    class LensGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = model.head if head is None else head

        def forward(self, *args):
            hidden, target, valid = list(args[:n]), args[n], args[n + 1]
            # targets come in already shifted for decoders (lens_targets outside): the input-token rule applies
            return lens_outputs(self.head, hidden, list(range(n)), target, valid, k, False, divergence=True)

    return LensGraph().eval()


def _trace_head(model, k: int, hidden_size: int, opset: int, path: Path, head=None) -> None:
    import torch

    n = model.num_layers + 1
    b, s = 2, 5
    dummy = [torch.randn(b, s, hidden_size) for _ in range(n)]
    ids = torch.randint(0, 3, (b, s))
    mask = torch.ones(b, s, dtype=torch.int64)
    names = hidden_outputs(model.num_layers) + [TARGET, VALID]
    axes = {nm: {0: "batch_size", 1: "sequence_length"} for nm in names}
    axes.update({o: {1: "batch_size", 2: "sequence_length"} for o in OUTPUTS})
    try:  # no constant folding: the head's weights stay as they are stored, so they can be shared, not copied
        torch.onnx.export(_graph_module(model, k, head), tuple(dummy + [ids, mask]), str(path), input_names=names,
                          output_names=list(OUTPUTS), dynamic_axes=axes, opset_version=opset, dynamo=False,
                          do_constant_folding=False)
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"could not export the lens head to ONNX: {str(exc).splitlines()[0][:300]}") from exc


def _share_stored_head(proto, export_dir: Path, manifest) -> int:
    """Point every initializer of ``proto`` equal (bytes and size) to a float32 tensor of the export's stored head
    file at that tensor's bytes, as ONNX external data; returns the bytes so shared."""
    import hashlib

    from onnx import TensorProto, numpy_helper

    from layerscope.model.manifest_check import member

    entry = manifest.lm_head
    if not entry or not entry.get("file"):
        return 0
    path = member(Path(export_dir), entry["file"], "lm_head file")
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    start = 8 + size
    stored = np.memmap(path, dtype=np.uint8, mode="r")
    where: dict[tuple[bytes, int], int] = {}
    for name, info in header.items():
        if name == "__metadata__" or info.get("dtype") != "F32":
            continue
        a, b = (int(x) for x in info["data_offsets"])
        where[(hashlib.sha256(stored[start + a:start + b]).digest(), b - a)] = start + a
    del stored
    shared = 0
    for init in proto.graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            continue
        raw = init.raw_data or numpy_helper.to_array(init).tobytes()
        offset = where.get((hashlib.sha256(raw).digest(), len(raw)))
        if offset is None or len(raw) < 1024:
            continue
        for field in ("float_data", "raw_data"):
            init.ClearField(field)
        external._set_info(init, path.name, offset, len(raw))
        shared += len(raw)
    return shared


def export_lens(export_dir: str | Path, k: int = 5, *, check: bool = True, tuned=None,
                say: Callable[[str], None] | None = None) -> LensSidecar:
    """Write ``lens-k{k}.onnx`` (+ its sidecar ``lens-k{k}.json``) next to ``model.onnx``; returns the sidecar. The files
    join the export's record of layerscope's files (``--force`` may replace them). ``say``: told a line as each
    stage starts (loading the head, tracing it, sharing its weights, the check against torch), each of which
    may take minutes on a real-size model. ``tuned``: a ``TunedLens`` (decoding/tuned_lens.py, checked to fit the
    model first) whose translators go before the head, in ``lens-tuned-{id}-k{k}.onnx``."""
    from layerscope.ownership import writing

    with writing(export_dir, "export") as wrote:
        return _export_lens(export_dir, k, wrote, check=check, tuned=tuned, say=say or (lambda _line: None))


def _export_lens(export_dir: str | Path, k: int, wrote, *, check: bool, tuned, say: Callable[[str], None]) -> LensSidecar:
    import onnx

    from layerscope.decoding.heads import load_decoding_model
    from layerscope.export.graph import opset_of
    from layerscope.hashing import file_sha256
    from layerscope.model.derived import source_sha256
    from layerscope.model.handle import ModelHandle
    from layerscope.progress import still

    if k < 1:
        raise InputError(f"--lens-k must be at least 1, not {k}")
    handle = ModelHandle.resolve(export_dir)
    if not handle.is_export:
        raise InputError(f"{export_dir} is not an export dir; run layerscope export first")
    vocab = int(handle.manifest.vocab_size)
    if k > vocab:
        raise InputError(f"--lens-k {k} is larger than the vocabulary ({vocab})")
    if tuned is not None:
        from layerscope.decoding.tuned_lens import fits_model

        fits_model(tuned.config, handle.manifest, f"the tuned lens {tuned.path}")
    say(f"lens head 1/4: loading the decoding head of {handle.export_dir.name} in PyTorch")
    with still(say, "loading the decoding head"):
        model = load_decoding_model(handle)
    decoder_head = None
    if tuned is not None:
        from layerscope.decoding.tuned_lens import head_unembedding, translated_head, unembedding_hash

        weight = head_unembedding(model)
        tuned.check_fits(handle.manifest, unembedding_hash=unembedding_hash(weight) if weight is not None else None)
        decoder_head = translated_head(model.head, tuned.translators)
    opset = opset_of(onnx.load(str(handle.onnx_path), load_external_data=False))
    out_dir = Path(handle.export_dir)
    what = f"the tuned lens's graph ({tuned.translators.layers} translators)" if tuned is not None else "the head graph"
    # traced beside the export, not in /tmp: a large vocabulary's head is GBs, more than a small /tmp holds
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".lens-trace-") as tmp:
        head_path = Path(tmp) / "head.onnx"
        say(f"lens head 2/4: tracing {what} ({model.num_layers + 1} layers, vocabulary {vocab:,}, top-{k})")
        with still(say, "tracing the lens head graph"):
            _trace_head(model, k, handle.manifest.hidden_size, opset, head_path, decoder_head)
        head = onnx.load(str(head_path))
    say("lens head 3/4: pointing the graph at the stored head's weights and writing it")
    shared = _share_stored_head(head, out_dir, handle.manifest)
    target = out_dir / lens_file(k, tuned)
    lens_data = external.data_file(target.name)
    tmp_file = target.with_suffix(".onnx.tmp")
    wrote.add(target.name, tmp_file.name, lens_data, sidecar_name(k, tuned_id(tuned)))  # named before written
    # what the stored head does not hold (an export made without one): written once, beside the graph
    external.externalize(list(head.graph.initializer), out_dir, lens_data)
    onnx.save(head, str(tmp_file))
    os.replace(tmp_file, target)
    external.check_graph(target)
    parity = None
    if check:
        say(f"lens head 4/4: checking the graph against torch on {len(PARITY_TEXTS)} texts")
        with still(say, "checking the lens head against torch"):
            parity = lens_parity(handle, model, target, k, head=decoder_head)
        if (parity.rank_mismatch_fraction > 0.001 or parity.max_prob_diff > 1e-4 or parity.max_kl_diff > 1e-4
                or parity.max_logprob_diff > 1e-4):
            target.unlink()
            (out_dir / external.data_file(target.name)).unlink(missing_ok=True)
            raise ExportError(f"the lens graph does not match torch ({parity.to_dict()}); nothing was kept")
    sidecar = LensSidecar(file=target.name, k=k, head=LensHead(model.info.kind, model.info.description,
                                                                   model.info.final_norm, tuple(model.info.missing_head_weights)), outputs=OUTPUTS,
                          probabilities=PROBABILITIES, sha256=file_sha256(target),
                          model_onnx_sha256=handle.manifest.onnx_sha256, shared_bytes=shared,
                          shared_with=handle.manifest.lm_head.get("file") if shared else None, parity=parity,
                          tuned=None if tuned is None else TunedSource(tuned.params_sha256, tuned.translators.layers,
                                                                       tuned.translators.width, str(tuned.path)),
                          content_sha256=source_sha256(target))
    sidecar.to_disk(out_dir)
    return sidecar


def read_sidecar(handle, k: int, tuned=None) -> LensSidecar | None:
    """The sidecar of the export's top-``k`` lens graph (``tuned``: a ``TunedLens``'s), or None where there is
    none to use (made again): no graph, or one in an earlier form, with its softmax in another precision or of
    other translators, or one whose sidecar does not hold against the graph, the weights it reads and the export's
    model.onnx (model/derived.py ``lens_problem``). A garbled sidecar is one line."""
    from layerscope.model.derived import lens_problem

    path = Path(handle.export_dir) / sidecar_name(k, tuned_id(tuned))
    if not os.path.lexists(path) or not (Path(handle.export_dir) / lens_file(k, tuned)).exists():
        return None
    meta = LensSidecar.from_disk(path)
    if meta is None or meta.k != k or tuple(meta.outputs) != OUTPUTS:
        return None  # an earlier form of the lens graph
    if (meta.tuned.params_sha256 if meta.tuned else None) != (tuned.params_sha256 if tuned else None):
        return None  # other translators than these
    if meta.probabilities != PROBABILITIES:
        return None  # a graph whose softmax ran in another precision
    if lens_problem(handle.export_dir, handle.manifest, meta) is not None:
        return None  # made for an earlier model.onnx, or the graph or its weights changed since
    return meta


def positions_per_run(vocab: int, budget: int | None = None, *, layers: int = 1, hidden: int = 0) -> int:
    """Positions decoded per run of the head graph over ``layers`` layers: every layer's logits of the run within
    the bytes ``budget`` (default ``HEAD_BYTES``, ``LOGIT_BYTES`` a logit), and, given ``hidden``, their head
    multiply-adds (positions x layers x vocabulary x hidden) within ``HEAD_MACS``."""
    vocab, layers = max(int(vocab), 1), max(int(layers), 1)
    n = int(HEAD_BYTES if budget is None else budget) // (LOGIT_BYTES * layers * vocab)
    if hidden > 0:
        n = min(n, HEAD_MACS // (layers * vocab * int(hidden)))
    return max(1, n)


def onnx_lens(session, hidden: list[np.ndarray], input_ids: np.ndarray, mask: np.ndarray, decoder: bool, k: int,
              vocab: int, *, bar=None, divergence: bool = False) -> tuple[np.ndarray, ...]:
    """``(rank [L+1, B, S], top-k ids, top-k probabilities [L+1, B, S, k])`` of a batch's hidden states (every
    layer's ``[B, S, hidden]``) through the head graph, over the real tokens only, ``positions_per_run`` at a
    time; padding positions get rank 0, ids 0 and probabilities 0. ``bar``: a progress count advanced by the
    positions of each run. ``divergence``: also ``KL(final || layer)`` and the target's log-probability
    ``[L+1, B, S]`` (0 at padding)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    real = np.asarray(mask) > 0
    if decoder:  # the next token, where there is one (the torch path's lens_targets, in numpy)
        target = np.concatenate([ids[:, 1:], np.zeros_like(ids[:, :1])], axis=1)
        valid = real & np.concatenate([real[:, 1:], np.zeros_like(real[:, :1])], axis=1)
    else:
        target, valid = ids, real
    rows, cols = np.nonzero(real)
    n_layers, (b, s) = len(hidden), ids.shape
    rank = np.zeros((n_layers, b, s), np.int64)
    top_ids = np.zeros((n_layers, b, s, k), np.int64)
    top_p = np.zeros((n_layers, b, s, k), np.float64)
    kl, logprob = (np.zeros((n_layers, b, s)), np.zeros((n_layers, b, s))) if divergence else (None, None)
    fetch = list(OUTPUTS if divergence else DECODED)
    step = positions_per_run(vocab, layers=n_layers, hidden=int(np.shape(hidden[0])[-1]) if n_layers else 0)
    names = hidden_outputs(n_layers - 1)
    for a in range(0, len(rows), step):
        r, c = rows[a:a + step], cols[a:a + step]
        feed = {name: np.ascontiguousarray(np.asarray(h[r, c], dtype=np.float32)[None]) for name, h in zip(names, hidden)}
        feed[TARGET] = target[r, c][None]
        feed[VALID] = valid[r, c].astype(np.int64)[None]
        outs = session.run(fetch, feed)
        rank[:, r, c], top_ids[:, r, c], top_p[:, r, c] = outs[0][:, 0], outs[1][:, 0], outs[2][:, 0]
        if divergence:
            kl[:, r, c], logprob[:, r, c] = outs[3][:, 0], outs[4][:, 0]
        if bar is not None:
            bar.advance(len(r))
    return (rank, top_ids, top_p, kl, logprob) if divergence else (rank, top_ids, top_p)


def run_onnx_lens(session, inputs: dict[str, np.ndarray], hidden: list[np.ndarray], decoder: bool, k: int,
                  vocab: int, *, divergence: bool = False) -> tuple[np.ndarray, ...]:
    """``onnx_lens`` of model inputs (``input_ids``, ``attention_mask``) and their hidden states."""
    return onnx_lens(session, [np.asarray(h) for h in hidden], np.asarray(inputs["input_ids"]),
                     np.asarray(inputs["attention_mask"]), decoder, k, vocab, divergence=divergence)


def lens_of_export(handle, k: int, inputs: dict[str, np.ndarray], *, tuned=None,
                   divergence: bool = False) -> tuple[np.ndarray, ...]:
    """The lens of an export on model inputs: its ``model.onnx`` for the hidden states, then ``lens-k{k}.onnx``
    (``tuned``: that tuned lens's graph), both on ONNX Runtime's CPU provider."""
    from layerscope.engines.ort_session import make_session

    graph = make_session(handle.onnx_path, "CPUExecutionProvider")
    names = hidden_outputs(handle.manifest.num_layers)
    feed = {i.name: np.ascontiguousarray(inputs[i.name]) for i in graph.get_inputs()}
    hidden = graph.run(names, feed)
    del graph
    head = make_session(Path(handle.export_dir) / lens_file(k, tuned), "CPUExecutionProvider")
    return run_onnx_lens(head, inputs, hidden, handle.manifest.kind == "decoder", k, int(handle.manifest.vocab_size),
                         divergence=divergence)


def lens_parity(handle, model, path: Path, k: int, texts: list[str] | None = None, *, head=None) -> LensParity:
    """ONNX Runtime (CPU) vs the torch computation on a padded batch: rank and top-k agreement, KL to the final
    layer and the target's log-probability. ``head``: what the graph decodes with (a tuned lens's
    ``translated_head``; default the model's own head)."""
    from layerscope.decoding.heads import model_inputs
    from layerscope.decoding.lens import rank_bands, torch_lens
    from layerscope.engines.ort_session import make_session

    inputs = model_inputs(handle, handle.tokenizer(), texts or PARITY_TEXTS, 64)
    layers = list(range(model.num_layers + 1))
    hidden, reference = _reference_hidden(handle, model, inputs)
    ref = torch_lens(model, inputs, layers, k, hidden, head=head, divergence=True)
    session = make_session(path, "CPUExecutionProvider")
    r, ids, p, kl, logprob = run_onnx_lens(session, {n: t.numpy() for n, t in inputs.items()},
                                           [h.numpy() for h in hidden], model.family.kind == "decoder", k,
                                           int(handle.manifest.vocab_size), divergence=True)
    del session
    valid = ref.mask.astype(bool)
    lo, hi = rank_bands(model, inputs, layers, RANK_TIE_REL_TOL, hidden, head=head)
    outside = (r < lo) | (r > hi)
    rank_mis = float(outside[:, valid].mean())
    top1_mis = float((ids[:, valid, 0] != ref.topk_ids[:, valid, 0]).mean())
    return LensParity(rank_mismatch_fraction=rank_mis, rank_tie_rel_tol=RANK_TIE_REL_TOL,
                      rank_exact_mismatch_fraction=float((r[:, valid] != ref.rank[:, valid]).mean()),
                      top1_mismatch_fraction=top1_mis,
                      max_prob_diff=float(np.abs(p[:, valid] - ref.topk_probs[:, valid]).max()),
                      reference_hidden_states=reference,
                      max_kl_diff=float(np.abs(kl[:, valid] - ref.kl[:, valid]).max()),
                      max_logprob_diff=float(np.abs(logprob[:, valid] - ref.logprob[:, valid]).max()))


def _reference_hidden(handle, model, inputs):
    """The hidden states the torch head decodes for the check, and where they came from.

    The torch base model when the source checkpoint is there; otherwise the export's own graph
    (``model.onnx``, itself checked against torch at export time), so the check still covers the
    appended head and its rank / top-k arithmetic.
    """
    import torch

    from layerscope.decoding.lens import base_hidden_states
    from layerscope.engines.ort_session import make_session

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
