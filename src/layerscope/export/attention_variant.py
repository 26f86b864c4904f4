"""Making the attention variant of an export, checking it against Hugging Face eager attention, recording it.

``make_attention_variant(export_dir)`` traces ``model.attn.onnx`` (export/attention.py), then compares
every layer's probabilities and every summary with PyTorch on right- and left-padded batches of the
validation texts: each pattern against transformers' own ``output_attentions`` over the real query rows
(padding rows hold whatever a model puts there and are never read), each summary against the same function
run on transformers' patterns.  Outside :data:`~layerscope.export.attention.ATOL` nothing is written.
Its entry records the ``model.onnx`` it was made for (``source_sha256``): the entry is held to the graph and to
the export's graph as it is now before the graph is used (model/derived.py ``attention_problem``), else it is
made again.
A vision tower's graph is export/vision_attention.py's, in the export's precision (an fp16 export: fp16, held
to the fp32 eager model within ``vision_attention.ATOL_FP16``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError
from layerscope.export import attention as att
from layerscope.hashing import file_sha256
from layerscope.model.manifest import MANIFEST, read_manifest


def make_attention_variant(export_dir: str | Path, *, force: bool = False, opset: int = 18,
                           progress=None, trust_remote_code: bool = False) -> dict[str, Any]:
    """Write, check and record ``model.attn.onnx`` beside the export; return its manifest entry."""
    from layerscope.ownership import writing

    with writing(export_dir, "export") as wrote:
        return _make(Path(export_dir), wrote, force=force, opset=opset, progress=progress,
                     trust_remote_code=trust_remote_code)


def _make(export_dir: Path, wrote, *, force: bool, opset: int, progress, trust_remote_code: bool) -> dict[str, Any]:
    from layerscope.export.variant_files import discard_variant as _discard, record_variant as _record, variant_names
    from layerscope.model.derived import attention_problem
    from layerscope.model.families import family_of
    from layerscope.model.manifest import verify_export
    from layerscope.model.source import load_torch_model

    say = progress or (lambda msg: None)
    manifest = read_manifest(export_dir)
    verify_export(export_dir, manifest)
    existing = manifest.variant(att.KIND)
    if existing and not force and attention_problem(export_dir, manifest, att.output_names(manifest.num_layers)) is None:
        return existing.to_dict()  # its entry holds against the graph and the export's model.onnx: kept
    family = family_of(manifest)
    dst = export_dir / att.FILE
    wrote.add(*variant_names(dst), MANIFEST)
    t0 = time.perf_counter()
    try:
        if manifest.modality == "image":  # a vision tower: pixels in, no padding, no special tokens
            from layerscope.export import vision_attention as va

            special = []
            half = manifest.precision == "fp16"  # the graph in the export's precision
            precision, tolerance = ("fp16", va.ATOL_FP16) if half else ("fp32", att.ATOL)
            net = va.vision_attention_net(manifest)
            say(f"tracing every layer's attention probabilities over the image's tokens (eager attention, {precision})")
            kept_fp32 = va.trace_vision_attention(net, dst, manifest, opset, half=half)
            say("checking every layer and head against transformers' output_attentions (fp32)")
            parity = va.vision_attention_parity(net, dst, manifest, export_dir, half=half)
        else:
            precision, tolerance, kept_fp32 = "fp32", att.ATOL, None
            tok = _tokenizer(export_dir, trust_remote_code)
            special = att.special_token_ids(tok)
            net = load_torch_model(manifest.source.model_source(), family, attn_implementation="eager",
                                   trust_remote_code=trust_remote_code)
            say("tracing every layer's attention probabilities (eager attention)")
            _trace_into(export_dir, dst, net, manifest, special, decoder=family.kind == "decoder", opset=opset)
            say("checking every layer and head against transformers' output_attentions (right and left padding)")
            parity = attention_parity(net, dst, manifest, tok, special)
        worst = [f"{name} max |diff| {s['max_abs']:.3g} > {s['tolerance']:.3g}"
                 for name, s in parity["outputs"].items() if not s["max_abs"] <= s["tolerance"]]
        if worst:
            raise ExportError(f"the attention graph does not match transformers: {worst[0]}; nothing was written")
    except BaseException:
        _discard(export_dir, att.KIND, dst)
        raise
    from layerscope.export import external as ext

    data = {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in ext.data_files(dst)}
    entry = {"file": dst.name, "sha256": file_sha256(dst), "source_sha256": manifest.onnx_sha256,
             "bytes": dst.stat().st_size + sum(d["bytes"] for d in data.values()), "external_data": data or None,
             "precision": precision, "build_seconds": round(time.perf_counter() - t0, 2),
             "details": {"outputs": att.output_names(manifest.num_layers), "summaries": list(att.SUMMARIES),
                         "special_ids": special, "attention": "eager",
                         "heads": parity.pop("heads"),
                         **({} if kept_fp32 is None else {"fp16_nodes_kept_fp32": kept_fp32})},
             "tolerance": {"max_abs": tolerance, "relative_to_scale_above_1": True, "reference": "torch fp32"},
             "parity": parity}
    _record(export_dir, att.KIND, entry)
    return entry


def _trace_into(export_dir: Path, dst: Path, net, manifest, special: list[int], *, decoder: bool, opset: int) -> None:
    """Trace in a folder of its own (torch writes one file per tensor for a graph over 2 GiB), gather those
    into ``<file>_data`` as the export's are, then move the graph and its data beside the export."""
    import os
    import tempfile

    from layerscope.export import external as ext

    with tempfile.TemporaryDirectory(dir=export_dir, prefix=".attn-trace-") as tmp:
        path = Path(tmp) / dst.name
        att.trace_attention(net, path, input_names=list(manifest.inputs), num_layers=manifest.num_layers,
                            special_ids=special, decoder=decoder, vocab_size=int(manifest.vocab_size or 2),
                            opset=opset)
        ext.consolidate(path)
        for f in ext.data_files(path):
            os.replace(f, export_dir / f.name)
        os.replace(path, dst)


def _tokenizer(export_dir: Path, trust_remote_code: bool = False):
    from layerscope.model.source import ModelSource, load_tokenizer

    return load_tokenizer(ModelSource(str(export_dir), str(export_dir), True), trust_remote_code=trust_remote_code)


def attention_parity(net, onnx_path: Path, manifest, tok, special: list[int],
                     texts: list[str] | None = None) -> dict[str, Any]:
    """Worst difference per output between the graph (ONNX Runtime, CPU) and transformers, over the real
    query rows of right- and left-padded batches."""
    import torch

    from layerscope.engines.ort import make_session
    from layerscope.export.validate import VALIDATION_TEXTS
    from layerscope.model.tokenize import Encoder

    texts = texts or [t for t in VALIDATION_TEXTS[:6]]
    encoder = Encoder(tok, list(manifest.inputs), min(manifest.max_length, 128))
    session = make_session(onnx_path, "CPUExecutionProvider")
    names = [o.name for o in session.get_outputs()]
    stats: dict[str, dict[str, float]] = {}
    for feed in att.padded_batches(encoder, texts):
        got = dict(zip(names, session.run(names, feed)))
        tfeed = {k: torch.from_numpy(v) for k, v in feed.items()}
        with torch.no_grad():
            out = net(**tfeed, output_attentions=True, return_dict=True,
                      **({"use_cache": False} if manifest.kind == "decoder" else {}))
            probs = [a.float() for a in out.attentions]
            ref_stats = att.summaries(torch.stack(probs, 1), tfeed["attention_mask"], tfeed["input_ids"],
                                      torch.tensor(special or [-1]))
        rows = feed["attention_mask"].astype(bool)
        ref = {att.pattern_output(i + 1): p.numpy() for i, p in enumerate(probs)}
        ref.update({att.summary_output(s): v.numpy() for s, v in zip(att.SUMMARIES, ref_stats)})
        for name, want in ref.items():
            have = got[name]
            if name.startswith(att.PATTERN_PREFIX):  # [B, H, T, T]: real query rows only
                want, have = want.transpose(0, 2, 1, 3)[rows], have.transpose(0, 2, 1, 3)[rows]
            both = np.isnan(want) & np.isnan(have)  # 'previous' of a one-token text: NaN on both sides
            diff = np.where(both, 0.0, np.abs(want.astype(np.float64) - have))
            worst = float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0))
            scale = float(np.nanmax(np.abs(want), initial=0.0))
            prev = stats.get(name, {"max_abs": 0.0, "ref_max_abs": 0.0})
            stats[name] = {"max_abs": max(prev["max_abs"], worst), "min_cos": None,
                           "ref_max_abs": max(prev["ref_max_abs"], scale)}
    for s in stats.values():  # probabilities are <= 1; distances count positions, so the bar grows with them
        s["tolerance"] = att.ATOL * max(1.0, s["ref_max_abs"])
    return {"heads": int(probs[0].shape[1]), "texts": len(texts), "batches": 2, "padding": ["right", "left"], "outputs": stats}
