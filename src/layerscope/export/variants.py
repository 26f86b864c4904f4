"""Optimized and reduced-precision variants of an export: ``opt``, ``int8``, ``fp16``, ``bf16``.

Each variant is another ``.onnx`` file in the same export dir (``model.<kind>.onnx``)
whose outputs are exactly the fp32 export's outputs (every hidden state,
``raw_embeddings``, ``pooled.*``).  It is checked against PyTorch fp32 on the
same validation batches as the export itself, and recorded in
``manifest.json`` under ``variants``: file, sha256, per-output parity,
fusions that applied, the tolerance it was held to.  A variant outside its
tolerance is not written.

- ``opt``: ONNX Runtime's offline transformer optimizer (attention, LayerNorm,
  GELU, embedding fusion).  Fusion counts come from the optimizer itself, so
  an extra graph output that blocks a fusion shows up as a missing count.
- ``gqa``: rotary decoders (Qwen2, Qwen2.5, Qwen3, Llama, Mistral, OLMo-2, Granite) with each layer's attention one
  ``GroupQueryAttention`` node, rotary embedding and Qwen3's q/k norms fused, grouped key/value heads
  read without the ``repeat_kv`` copies (``export/gqa.py``); fp32.
- ``int8``: dynamic quantization of the weight MatMuls only (per-channel int8
  weights, uint8 activations quantized per batch).  Activation x activation
  MatMuls (attention scores, the in-graph pooling) stay in fp32: quantizing
  those is what drops layers' cosine to ~0.9.
- ``int8-block``: int8 weights in blocks of 32 along the reduction axis, each block with its own
  scale (ONNX Runtime's ``MatMulNBits``, 8 bits), run with accuracy level 4: activations quantized to
  int8 per block of 32 at run time, products in int8 on VNNI. Finer scales on both sides than
  ``int8``'s one scale per output channel and one per activation tensor: on all-MiniLM-L6-v2 every
  hidden state stays at cosine >= 0.9996 to fp32, where ``int8`` drops the last layers to 0.967.
- ``fp16``: weights and compute in fp16, inputs/outputs fp32, with
  LayerNormalization/Softmax/reductions/pooling kept in fp32.
- ``bf16``: ONNX Runtime's CPU execution provider has no bf16 MatMul or Add
  kernels (checked with onnxruntime 1.31: a bf16 MatMul graph fails with
  NOT_IMPLEMENTED); asking for it raises a clear error.
- ``opt`` then ``int8`` is refused: the dynamic quantizer cannot infer the
  types of the optimizer's com.microsoft ops.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from layerscope.errors import ExportError, InputError
from layerscope.export.half import FP16_BLOCK_LIST
from layerscope.export.variant_files import (discard_variant, quiet, record_variant, save_variant, variant_data_files,
                                               variant_names, variant_parity, worst_output)
from layerscope.hashing import file_sha256
from layerscope.model.manifest import MANIFEST, read_manifest
from layerscope.model.manifest_type import Manifest
from layerscope.model.variants import OV_KINDS, check_kind, variant_file


# Held per output against fp32 PyTorch.  max_abs None means "recorded, not a limit":
# reduced precision is judged by direction (cosine), since hidden-state magnitudes differ by layer.
TOLERANCES: dict[str, dict[str, float | None]] = {
    "opt": {"max_abs": 1e-4, "min_cos": 0.99999},
    "gqa": {"max_abs": None, "min_cos": 0.99999},  # fp32; decoders' hidden states reach 1e3-1e4
    "int8": {"max_abs": None, "min_cos": 0.96},
    "int8-block": {"max_abs": None, "min_cos": 0.99},
    "fp16": {"max_abs": None, "min_cos": 0.999},
}

INT8_KEEP_DOWN_PROJ = False



def _num_heads(manifest: Manifest) -> int:
    """The attention heads the optimizer fuses, from the export's anatomy (0: let it read them from the graph)."""
    anatomy = manifest.anatomy
    return anatomy.attention.heads if anatomy is not None and anatomy.attention is not None else 0


# ---------------------------------------------------------------- the three transforms

def optimize_graph(src: Path, dst: Path, manifest: Manifest, num_heads: int, *,
                   external: bool = False) -> dict[str, int]:
    """Offline transformer fusion; returns the optimizer's own fused-operator counts (non-zero ones)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from layerscope.model.families import FAMILIES

    family = FAMILIES.get(manifest.family)
    model_type = family.optimizer_model_type if family else "bert"
    options = FusionOptions(model_type)
    with quiet():
        opt = optimize_model(str(src), model_type=model_type, num_heads=num_heads,
                             hidden_size=manifest.hidden_size, opt_level=0, use_gpu=False,
                             optimization_options=options)
    stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
    if any(n.domain == "com.microsoft" for n in opt.model.graph.node) and \
            not any(o.domain == "com.microsoft" for o in opt.model.opset_import):
        from onnx import helper  # the optimizer forgets this; the quantizer's shape inference needs it

        opt.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    save_variant(opt.model, dst, external=external)
    return stats


def quantize_int8(src: Path, dst: Path, *, keep_down_proj: bool = INT8_KEEP_DOWN_PROJ,
                  external: bool = False) -> dict[str, Any]:
    """Dynamic int8 of the weight MatMuls (and fused Attention weights); everything else stays fp32.

    With ``keep_down_proj`` the feed-forward down-projections (weight ``[k, n]`` with ``k > n``)
    stay fp32: their input is the post-GELU activation whose outliers make one per-tensor
    uint8 scale coarse for every other value.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src), load_external_data=False)  # names and shapes only
    weights = {i.name: tuple(i.dims) for i in model.graph.initializer}
    targets = []
    skipped = 0
    kept_down = 0
    for node in model.graph.node:
        if node.name.startswith("layerscope/"):
            continue  # in-graph pooling and raw embeddings: exact fp32
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights:
            shape = weights[node.input[1]]
            if keep_down_proj and len(shape) == 2 and shape[0] > shape[1]:
                kept_down += 1
                continue
            targets.append(node.name)
        elif node.op_type == "Attention":
            targets.append(node.name)
        elif node.op_type in ("MatMul", "Gemm"):
            skipped += 1
    if not targets:
        raise ExportError(f"{src.name} has no weight MatMul to quantize")
    with quiet():
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         nodes_to_quantize=targets, op_types_to_quantize=["MatMul", "Attention"],
                         extra_options={"MatMulConstBOnly": True}, use_external_data_format=external)
    if external:  # ONNX Runtime writes <file>.data; gathered into the page-aligned <file>_data like the export's
        from layerscope.export import external as ext

        ext.consolidate(dst)
    return {"quantized_nodes": len(targets), "activation_matmuls_fp32": skipped,
            "down_projections_fp32": kept_down, "weight_type": "int8 per-channel",
            "activations": "uint8 dynamic per batch"}


INT8_BLOCK = 32


def quantize_int8_block(src: Path, dst: Path, *, block: int = INT8_BLOCK, external: bool = False) -> dict[str, Any]:
    """Weight MatMuls to ``MatMulNBits`` with 8-bit symmetric weights per block of ``block`` rows, run at
    accuracy level 4 (int8 activations per block); the in-graph pooling and raw embeddings stay fp32."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = onnx.load(str(src))
    keep = [n.name for n in model.graph.node if n.name.startswith("layerscope/")]
    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=4, bits=8)
    with quiet():
        quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=keep, algo_config=config)
        quantizer.process()
    out = quantizer.model.model
    quantized = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    if not quantized:
        raise ExportError(f"{src.name} has no weight MatMul to quantize")
    save_variant(out, dst, external=external)
    return {"quantized_nodes": quantized, "weight_type": f"int8 symmetric per block of {block}",
            "activations": f"int8 per block of {block} at run time (accuracy level 4)"}


def convert_fp16(src: Path, dst: Path, *, external: bool = False) -> dict[str, Any]:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    keep = [n.name for n in model.graph.node if n.name.startswith("layerscope/")]
    with quiet():
        half = convert_float_to_float16(model, keep_io_types=True, op_block_list=FP16_BLOCK_LIST,
                                        node_block_list=keep)
    # The converter inserts one identical Cast per consumer of a blocked Cast node (same name, same
    # output), which ONNX Runtime rejects as a duplicate definition: keep the first of each.
    seen: set[bytes] = set()
    nodes = []
    for node in half.graph.node:
        key = node.SerializeToString()
        if key not in seen:
            seen.add(key)
            nodes.append(node)
    dropped = len(half.graph.node) - len(nodes)
    del half.graph.node[:]
    half.graph.node.extend(nodes)
    save_variant(half, dst, external=external)
    return {"kept_fp32_ops": FP16_BLOCK_LIST, "kept_fp32_nodes": len(keep), "duplicate_casts_dropped": dropped}


# ---------------------------------------------------------------- make + check + record

def make_variant(export_dir: str | Path, kind: str, *, force: bool = False,
                 tolerance: dict[str, float | None] | None = None, progress=None,
                 trust_remote_code: bool = False) -> dict[str, Any]:
    """Write ``model.<kind>.onnx`` next to ``model.onnx``, check it against torch, record it; return its entry.
    The files it writes join the export's record of layerscope's files (``--force`` may replace them).
    ``trust_remote_code`` is the user's flag: the torch reference of an export of the model's own code runs
    that code, never because the manifest says so."""
    from layerscope.ownership import writing

    require_flag_for_code(export_dir, kind, trust_remote_code)
    if check_kind(kind) == "attn":  # its own graph and outputs (export/attention_variant.py)
        from layerscope.export.attention_variant import make_attention_variant

        return make_attention_variant(export_dir, force=force, progress=progress, trust_remote_code=trust_remote_code)
    with writing(export_dir, "export") as wrote:
        return _make_variant(export_dir, kind, wrote, force=force, tolerance=tolerance, progress=progress,
                             trust_remote_code=trust_remote_code)


def require_flag_for_code(export_dir: str | Path, kind: str, trust_remote_code: bool) -> None:
    """One line, before any work, where the export ran the model's own code (its torch reference, and the
    attention graph's trace, load the model through that code) and the user did not pass --trust-remote-code."""
    from layerscope.model.own_code import require_code_flag

    require_code_flag(read_manifest(Path(export_dir)), str(export_dir), trust_remote_code,
                      f"making its variant '{kind}' (checked against PyTorch)")


def _make_variant(export_dir: str | Path, kind: str, wrote, *, force: bool = False,
                  tolerance: dict[str, float | None] | None = None, progress=None,
                  trust_remote_code: bool = False) -> dict[str, Any]:
    from layerscope.model.derived import variant_problem
    from layerscope.model.manifest import verify_export

    check_kind(kind)
    if kind in OV_KINDS:
        from layerscope.export.ov_variant import make_ov_variant

        if kind == "ov-int8":
            (progress or (lambda msg: None))("ov-int8 reads the int8 variant: making or checking it first")
            make_variant(export_dir, "int8", progress=progress, trust_remote_code=trust_remote_code)
        return make_ov_variant(export_dir, kind, force=force, tolerance=tolerance, progress=progress,
                               trust_remote_code=trust_remote_code)
    say = progress or (lambda msg: None)
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    if kind == "gqa":
        from layerscope.export.gqa import check_gqa

        check_gqa(export_dir, manifest)  # before the export's files are hashed
    verify_export(export_dir, manifest)
    existing = manifest.variant(kind)
    if existing and not force and variant_problem(export_dir, manifest, kind) is None:
        return existing.to_dict()  # its files as recorded, made for the export's graph as it is now: kept
    src = export_dir / manifest.onnx_file
    big = manifest.external_data  # then the variant keeps its weights in <file>_data too
    dst = export_dir / variant_file(kind)
    wrote.add(*variant_names(dst), MANIFEST)  # named before they are written
    t0 = time.perf_counter()
    details: dict[str, Any] = {}
    fusions: dict[str, int] | None = None
    try:
        if kind == "opt":
            say("fusing with the ONNX Runtime transformer optimizer")
            fusions = optimize_graph(src, dst, manifest, _num_heads(manifest), external=big)
        elif kind == "gqa":
            from layerscope.export.gqa import fuse_gqa

            say("fusing each layer's attention into one GroupQueryAttention node")
            details = fuse_gqa(src, dst, manifest, external=big)
        elif kind == "int8":
            say("quantizing weight MatMuls to int8")
            details = quantize_int8(src, dst, external=big)
        elif kind == "int8-block":
            say(f"quantizing weight MatMuls to int8 in blocks of {INT8_BLOCK}")
            details = quantize_int8_block(src, dst, external=big)
        elif kind == "fp16":
            say("converting to fp16 (LayerNorm, Softmax, reductions and pooling kept in fp32)")
            details = convert_fp16(src, dst, external=big)
    except (InputError, ExportError):
        discard_variant(export_dir, kind, dst)
        raise
    except Exception as exc:  # the optimizer and quantizer raise untyped errors
        discard_variant(export_dir, kind, dst)
        raise ExportError(f"could not make variant '{kind}': {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from exc
    build_s = time.perf_counter() - t0
    try:
        _check_outputs(src, dst)
        say("checking every output against PyTorch fp32")
        parity = variant_parity(export_dir, manifest, dst, trust_remote_code=trust_remote_code)
        tol = dict(TOLERANCES[kind], **(tolerance or {}))
        worst = worst_output(parity["outputs"], tol)
        if worst:
            raise ExportError(f"variant '{kind}' is outside its tolerance: {worst}; nothing was written")
    except BaseException:
        discard_variant(export_dir, kind, dst)
        raise
    data = {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in variant_data_files(dst)}
    entry = {
        "file": dst.name, "sha256": file_sha256(dst), "bytes": dst.stat().st_size + sum(d["bytes"] for d in data.values()),
        "external_data": data or None,
        "precision": {"opt": "fp32", "gqa": "fp32", "int8": "int8", "int8-block": "int8", "fp16": "fp16"}[kind],
        "build_seconds": round(build_s, 2), "fusions": fusions, "details": details,
        "tolerance": tol, "parity": parity,
    }
    record_variant(export_dir, kind, entry)
    return entry


def _check_outputs(src: Path, dst: Path) -> None:
    import onnx

    want = [o.name for o in onnx.load(str(src), load_external_data=False).graph.output]
    got = [o.name for o in onnx.load(str(dst), load_external_data=False).graph.output]
    if want != got:
        missing = sorted(set(want) - set(got))
        raise ExportError(f"{dst.name} lost outputs {missing or '-'} (order or names changed); the transform "
                          "must keep every hidden-state and pooled output")
