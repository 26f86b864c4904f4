"""``layerscope export``: Optimum export with every hidden state, raw embeddings, in-graph pooling, parity check.

The export is written into a temporary sibling directory and renamed into
place only after it matched PyTorch, so a failed export never leaves a
directory that looks valid.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError
from layerscope.progress import still
from layerscope.export import external, lean
from layerscope.export.manifest_write import FP32_RTOL, build_manifest, fp32_worst, opset_of_file, save_tokenizer
from layerscope.export.graph import add_pooled_outputs, add_raw_embeddings_output, hidden_output_names
from layerscope.export.onnx_config import export_path, make_onnx_config
from layerscope.export.validate import VALIDATION_TEXTS, compare_outputs
from layerscope.model.describe import describe_source
from layerscope.export.anatomy_facts import anatomy_facts, model_anatomy
from layerscope.model.manifest import MANIFEST, ONNX_FILE
from layerscope.model.manifest_type import Manifest
from layerscope.model.manifest_check import file_records
from layerscope.model.source import ModelSource
from layerscope.vocab.outputs import RAW_OUTPUT, hidden_outputs, output_layer
from layerscope.vocab.pooling import GRAPH_POOLINGS, MASK_POOLINGS, check_poolings, require_pooled_output

log = logging.getLogger("layerscope")

DEFAULT_OPSET = 18
EXTERNAL_DATA_BYTES = external.EXTERNAL_DATA_BYTES  # weights above this go to model.onnx_data (tests lower it)


def default_pooled(family) -> list[str]:
    """The in-graph poolings an export makes unless asked otherwise (``family``: a ``Family``)."""
    modes = list(MASK_POOLINGS)
    if family.pooled_output:
        modes.append("eos")
    return modes


def _one_writer(fn):
    """Run ``fn`` holding ``output``'s write lock (``lock=False``: the caller holds it already)."""
    import functools

    @functools.wraps(fn)
    def wrapper(source, output, *args, lock: bool = True, **kwargs):
        if not lock:
            return fn(source, output, *args, **kwargs)
        from layerscope.out_lock import out_lock

        with out_lock(output):
            return fn(source, output, *args, **kwargs)

    return wrapper


@_one_writer
def export_model(source: ModelSource, output: str | Path, *, pooled: list[str] | None = None,
                 opset: int = DEFAULT_OPSET, atol: float = 1e-4, rtol: float = FP32_RTOL, trust_remote_code: bool = False,
                 force: bool = False, validation_texts: list[str] | None = None,
                 progress=None, cache_entry: dict[str, Any] | None = None, dtype: str = "fp32",
                 tower: str | None = None, image_size: tuple[int, int] | None = None,
                 max_length: int | None = None) -> Manifest:
    """Export the resolved model ``source`` (``model.source.resolve_source``; its revision included) into
    ``output``; returns the manifest. Raises ExportError on a parity failure.

    ``dtype="fp16"`` traces the model loaded in fp16 (see ``export/half.py``) and holds every output
    to a depth-scaled cosine against torch fp32 instead of ``atol``.  ``tower="vision"`` exports the vision
    tower of a two-tower checkpoint (CLIP, SigLIP); a vision model's own type needs no tower.
    ``image_size`` (height, width): a vision tower read at that size instead of its checkpoint's.
    ``max_length``: the longest input its runs read by default, up to the model's positions, instead of what the
    checkpoint says (its sentence-transformers setting, an encoder's tokenizer limit, else the positions).
    """
    from layerscope.export.half import check_dtype
    from layerscope.ownership import claim

    if not isinstance(source, ModelSource):
        raise TypeError(f"export_model takes a resolved ModelSource (resolve_source(...)), not {type(source).__name__}")
    spec = source.spec
    dtype = check_dtype(dtype)
    output = Path(output)
    # the folder first, its record of layerscope's files included (--force): refused before any model file is read
    claim(output, "export", force=force, inputs=[spec])
    from layerscope.model.families import family_of_config
    from layerscope.model.source import load_config
    from layerscope.model.vision import describe_vision

    # read and derived once for the whole export, and handed down
    config = load_config(source, trust_remote_code=trust_remote_code)
    family = family_of_config(config, tower, trust_remote_code)
    vision = describe_vision(source, tower=tower, trust_remote_code=trust_remote_code, image_size=image_size,
                             config=config, family=family)
    if vision is None and image_size is not None:
        from layerscope.errors import InputError

        raise InputError(f"{spec} reads text: --image-size is for a vision tower (with --tower vision for CLIP "
                         "or SigLIP)")
    if vision is not None and max_length is not None:
        from layerscope.errors import InputError

        raise InputError(f"{spec} is a vision tower: it reads its image size's tokens; leave out --max-length")
    if vision is not None:  # a vision tower: pixel values in (export/vision_export.py)
        from layerscope.export.vision_export import export_vision

        return export_vision(source, output, vision, pooled=pooled, opset=opset, atol=atol, rtol=rtol,
                             trust_remote_code=trust_remote_code, force=force, progress=progress,
                             cache_entry=cache_entry, dtype=dtype, config=config, family=family)
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    info = describe_source(source, trust_remote_code=trust_remote_code, config=config, family=family)  # model half
    model = Manifest.from_dict(info, where=f"the description of {spec}")
    if max_length is not None:  # up to the model's positions, refused in one line before any work
        from layerscope.limits import check_max_length

        check_max_length(max_length, model, spec)
        info.update(max_length=int(max_length), max_length_from="--max-length at export")
        model = Manifest.from_dict(info, where=f"the description of {spec}")
    from layerscope.model.describe import length_line

    if (line := length_line(model)) is not None:
        say(line)
    from layerscope.model.source import load_torch_model

    requested = pooled if pooled is not None else default_pooled(family)
    pooled_modes = check_poolings(requested, available=GRAPH_POOLINGS) if requested else []  # [] = token-level outputs only
    require_pooled_output(pooled_modes, family.pooled_output, family.name)
    from layerscope.atomic import staged_dir

    with staged_dir(output, kind="export") as work:
        trace = dict(source=source.to_dict(), family=family.name, kind=family.kind,
                     family_from_code=model.family_from_code, num_layers=model.num_layers, dtype=dtype,
                     opset=opset, trust_remote_code=trust_remote_code, threshold=stream_threshold())
        weights = checkpoint_weight_bytes(source, dtype)
        if TRACE_IN_CHILD_BYTES is not None and weights is not None and weights >= TRACE_IN_CHILD_BYTES:
            # a big model is loaded and traced in a child process: its memory goes back to the OS when the
            # child exits (in-process, a 3B fp32 model's 12 GB stayed resident after it was freed)
            say(f"loading and exporting {model.source.path_or_id} ({family.name}, {model.num_layers} "
                f"layers, {weights / 1e9:.1f} GB of weights) in a child process")
            with still(say, "loading and exporting in the child process"):
                trace_in_child(trace, work, weights)
        else:
            say(f"loading {model.source.path_or_id} ({family.name}, {model.num_layers} layers)")
            say("exporting with optimum")
            with still(say, "loading and exporting with optimum"):
                trace_step(trace, work, config=config, family=family)
        say("adding raw embeddings and in-graph pooling")
        with still(say, "adding raw embeddings and in-graph pooling"):
            onnx_info = _postprocess(work, model, pooled_modes, half=dtype == "fp16")
            tokenizer_info = save_tokenizer(source, work, trust_remote_code, model.max_length)
        say("keeping the decoding head (lm_head.safetensors) for the lens")
        from layerscope.export.lm_head import save_head

        with still(say, "keeping the decoding head"):
            head_entry, head = save_head(source, family, model.num_layers, work,
                                         trust_remote_code=trust_remote_code, config=config)
        say("checking every output against PyTorch (fp32), and the model's anatomy by a forward pass")
        found: dict[str, Any] = {}

        def reference():  # the fp32 model the outputs are held to; its anatomy is found and checked on it
            net = load_torch_model(source, family, trust_remote_code=trust_remote_code, config=config)
            found["anatomy"] = model_anatomy(net, family, model.num_layers, head)
            return net

        with still(say, "checking every output against PyTorch"):
            parity = compare_outputs(reference, family, work / ONNX_FILE, model, validation_texts or VALIDATION_TEXTS,
                                     pooled_modes, onnx_info["pooled_layers"], trust_remote_code=trust_remote_code)
        worst_name, worst = fp32_worst(parity, atol, rtol) if dtype == "fp32" else (None, None)  # records each
        manifest = build_manifest(model, onnx_info, pooled_modes, parity, opset_of_file(work / ONNX_FILE), atol,
                                  time.perf_counter() - t0, work)
        manifest.update(tokenizer=tokenizer_info, export_path=export_path(family, config),
                        lm_head=head_entry,  # a lens made later reads its head here, not from the checkpoint
                        export_peak_rss_bytes=_peak_rss(),
                        **anatomy_facts(found["anatomy"], model, onnx_info["outputs"]))
        if cache_entry is not None:  # the export cache's key (export/cache.py), checked before reuse
            manifest.update(export_cache=cache_entry)
        if dtype == "fp16":
            manifest.update(fp16_nodes_kept_fp32=onnx_info["fp16_nodes_kept_fp32"])
            _check_half(spec, manifest, parity, model.num_layers)
        if dtype == "fp32":
            if not worst["max_abs"] <= worst["tolerance"]:  # also catches NaN
                raise ExportError(
                    f"export of {spec} does not match PyTorch: worst output {worst_name} differs by "
                    f"{worst['max_abs']:.3g} (tolerance {worst['tolerance']:.3g} = {atol:g} + {rtol:g} x its "
                    f"largest value {worst.get('ref_max_abs', 0):.3g}; min cosine {worst['min_cos']:.6f}); "
                    "nothing was written. Try --opset 17, or report the model")
        manifest.update(files=file_records(work))  # every file's sha256: layerscope verify re-hashes them
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Manifest.from_dict(manifest, where=str(output / MANIFEST))


def _peak_rss() -> int:
    """Peak resident memory so far (bytes) of this process or of the child that traced the model, whichever
    was larger: what the export needed at most."""
    import resource

    return max(int(resource.getrusage(who).ru_maxrss) * 1024
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _check_half(spec: str, manifest: dict[str, Any], parity: dict[str, Any], num_layers: int) -> None:
    from layerscope.export.half import fp16_failures, fp16_tolerance

    tolerance = fp16_tolerance(list(parity["outputs"]), num_layers)
    manifest.update(precision="fp16")
    manifest["parity"].update(tolerance_abs=None, tolerance_fp16=tolerance)
    bad = fp16_failures(parity["outputs"], tolerance)
    if bad:
        raise ExportError(f"fp16 export of {spec} drifts from PyTorch fp32: {bad[0]}"
                          f"{f' (and {len(bad) - 1} more outputs)' if len(bad) > 1 else ''}; nothing was written. "
                          "Export in fp32 (--dtype fp32)")


# Weights from which the model is loaded and traced in a child process (None: never). Its own constant, so
# tests that lower EXTERNAL_DATA_BYTES still see the streamed steps in-process; tests lower this one too.
TRACE_IN_CHILD_BYTES: int | None = lean.STREAM_BYTES


def stream_threshold() -> int:
    """Weights from which the export is traced without them and streamed (``lean.STREAM_BYTES``, or lower
    where the external-data limit is)."""
    return min(EXTERNAL_DATA_BYTES, lean.STREAM_BYTES)


def trace_step(trace: dict[str, Any], work: Path, *, config=None, family=None) -> None:
    """Load the torch model, export it into ``work`` and free it; ``trace`` holds export_model's arguments
    (``config`` and ``family``: as export_model read and derived them; a child process, which cannot be handed
    them, reads and derives them once itself)."""
    from layerscope.model.families import FAMILIES, code_family
    from layerscope.model.source import ModelSource, load_config, load_torch_model

    source = ModelSource(**trace["source"])  # resolved by export_model; the child loads exactly that
    if family is None:
        family = code_family(trace["family"], trace["kind"]) if trace.get("family_from_code") \
            else FAMILIES[trace["family"]]
    if config is None:
        config = load_config(source, trust_remote_code=trace["trust_remote_code"])
    model = load_torch_model(source, family, trust_remote_code=trace["trust_remote_code"], dtype=trace["dtype"],
                             config=config)
    from layerscope.model.anatomy_rules import own_last_differs

    try:
        own_last = own_last_differs(model)  # carried as an output of its own (what `st` reads at layer L)
    except Exception:  # noqa: BLE001 - a model's own code that cannot run the probe: the anatomy check says so
        own_last = False

    if export_path(family, config) == "torch":  # Optimum has no config for this architecture
        from layerscope.export.torch_export import torch_export

        text = family.text_model_config(config)
        streamed = lean.ENABLED and lean.weight_bytes(model) >= trace["threshold"]
        torch_export(model, work / ONNX_FILE, input_names=family.input_names(text), num_layers=trace["num_layers"],
                     opset=trace["opset"], decoder=family.kind == "decoder", vocab_size=int(text.vocab_size),
                     streamed=streamed, own_last=own_last)
        if not streamed:
            external.consolidate(work / ONNX_FILE)
        model.config.save_pretrained(work)  # as Optimum does: a lens rebuilds its head from it
        finish = lambda: None  # noqa: E731
    else:
        onnx_cfg = make_onnx_config(config, family, trace["num_layers"], own_last=own_last)
        finish = _optimum_export(model, work, onnx_cfg, trace["opset"], threshold=trace["threshold"])
    del model  # the ONNX check runs first and torch is reloaded after: never both in memory
    gc.collect()
    finish()  # a streamed export's output-shape fix runs the graph: only once torch's copy is gone


def _trace_child(trace: dict[str, Any], work: str, conn) -> None:
    """The child process's side of :func:`trace_in_child`: run the step, send back None or the error."""
    from layerscope.signals import child_start

    child_start()  # Ctrl-C is the parent's to answer: it stops this process
    try:
        trace_step(trace, Path(work))
        conn.send(None)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as one line
        from layerscope.errors import LayerscopeError

        kind = type(exc).__name__ if isinstance(exc, LayerscopeError) else "ExportError"
        conn.send((kind, str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__))
    finally:
        conn.close()


def trace_in_child(trace: dict[str, Any], work: Path, weights: int, *, target=None) -> None:
    """Run :func:`trace_step` in a spawned process; its errors come back as the same one-line errors, and a
    child killed by the kernel (out of memory) as an ExportError that says so."""
    import multiprocessing

    from layerscope import errors

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads and big tensors
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target or _trace_child, args=(trace, str(work), child), daemon=True)
    from layerscope.export.spawn import main_not_rerun

    with main_not_rerun():  # a caller's script without a __main__ guard is not run again in the child
        proc.start()
    child.close()
    try:
        message = parent.recv()
    except EOFError:  # the child died without a word
        message = None
    except BaseException:  # Ctrl-C: stop the child too; staged_dir removes what it wrote
        proc.terminate()
        proc.join()
        raise
    proc.join()
    if message is None and proc.exitcode == 0:
        return
    if message is not None:
        kind, text = message
        raise getattr(errors, kind, ExportError)(text)
    signal = -proc.exitcode if proc.exitcode and proc.exitcode < 0 else None
    why = "killed by the kernel, most likely out of memory" if signal == 9 else \
        f"stopped by signal {signal}" if signal else f"exit status {proc.exitcode}"
    raise ExportError(f"loading and tracing the model ({weights / 1e9:.1f} GB of weights) failed: the process was "
                      f"{why}; it needs about {weights * PEAK_PER_WEIGHT_BYTE / 1e9:.0f} GB of free memory; nothing was written")


PEAK_PER_WEIGHT_BYTE = 1.85  # the tracing child's peak over its fp32 weights, measured on the Qwen2.5-3B shape


def checkpoint_weight_bytes(source, dtype: str) -> int | None:
    """The model's weights in bytes at ``dtype`` (fp32: 4 per element, fp16: 2), from the headers of a local
    checkpoint's safetensors files (nothing is loaded); None for a hub model not on disk."""
    if not source.is_local:
        return None
    from safetensors import safe_open

    files = sorted(Path(source.path_or_id).glob("*.safetensors"))
    if not files:
        return None
    numel = 0
    try:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                numel += sum(math.prod(st.get_slice(key).get_shape()) for key in st.keys())
    except Exception:  # noqa: BLE001 - a damaged file is reported by the loader, with its name
        return None
    return numel * (2 if dtype == "fp16" else 4)


def _optimum_export(model, work: Path, onnx_cfg, opset: int, *, threshold: int):
    """Export with Optimum; returns what is left to do once the torch model is freed."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from optimum.exporters.onnx import onnx_export_from_model

    from layerscope.export.traceable import traceable

    # Above the threshold the weights are never copied: traced without them, written one by one after.
    streamed = lean.ENABLED and lean.weight_bytes(model) >= threshold

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prev = logging.getLogger("optimum").level
        logging.getLogger("optimum").setLevel(logging.ERROR)
        try:
            # Optimum gathers torch's per-tensor external files by loading the whole model into one
            # proto (a second copy of the weights); we stream them into one file ourselves instead.
            with patch("optimum.exporters.onnx.convert.check_model_uses_external_data", return_value=False), \
                    (lean.without_weights(onnx_cfg) if streamed else nullcontext()), traceable():
                onnx_export_from_model(
                    model, work, opset=opset, task="feature-extraction", do_validation=False,
                    custom_onnx_configs={"model": onnx_cfg}, model_kwargs={"output_hidden_states": True},
                    no_post_process=True,
                )
        except Exception as exc:  # optimum and torch.onnx raise many untyped errors
            raise ExportError(f"optimum could not export this model: {str(exc).splitlines()[0][:300]}") from exc
        finally:
            logging.getLogger("optimum").setLevel(prev)
    produced = list(work.glob("*.onnx"))
    if not (work / ONNX_FILE).exists():
        raise ExportError(f"optimum wrote {[p.name for p in produced]} instead of {ONNX_FILE}")
    if streamed:
        lean.attach_weights(work / ONNX_FILE, model, opset=opset)
        return lambda: onnx_cfg.fix_dynamic_axes(work / ONNX_FILE, device="cpu")  # optimum ran it on the full graph
    external.consolidate(work / ONNX_FILE)
    return lambda: None


def _postprocess(work: Path, info: Manifest, pooled_modes: list[str], *, half: bool = False) -> dict[str, Any]:
    import onnx

    path = work / ONNX_FILE
    model = onnx.load(str(path), load_external_data=False)  # the structure only: weights stay on disk
    was_external = external.uses_external_data(model)
    kept_fp32 = 0
    if half:
        from layerscope.export.half import cast_outputs_fp32, keep_sensitive_ops_fp32
        from layerscope.export.variants import FP16_BLOCK_LIST

        kept_fp32 = keep_sensitive_ops_fp32(model, FP16_BLOCK_LIST)
        cast_outputs_fp32(model, [o.name for o in model.graph.output])
    hidden_names = hidden_output_names(model)
    expected = hidden_outputs(info.num_layers)
    if hidden_names != expected:
        raise ExportError(f"the exported graph has hidden-state outputs {hidden_names}, expected {expected}")
    add_raw_embeddings_output(model, info.vocab_size)
    raw_dim = _output_dim(model, RAW_OUTPUT)
    layer_tensors = ([RAW_OUTPUT] if raw_dim in (None, info.hidden_size) else []) + hidden_names
    pooled_layers = [output_layer(t) for t in layer_tensors]
    if pooled_modes:
        add_pooled_outputs(model, pooled_modes, layer_tensors, info.hidden_size, info.eos_token_id)
    # Without its weights the proto is small, so ByteSize is safe; with them it is < 2 GiB or external.
    big = was_external or model.ByteSize() >= EXTERNAL_DATA_BYTES
    external.save_graph(model, path, external=big)
    external.check_graph(path)
    outputs = {}
    for o in model.graph.output:
        dims = [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
        outputs[o.name] = dims
    return {"outputs": outputs, "pooled_layers": pooled_layers, "external_data": big, "fp16_nodes_kept_fp32": kept_fp32,
            "inputs": [i.name for i in model.graph.input]}


def _output_dim(model, name: str) -> int | None:
    for o in model.graph.output:
        if o.name == name:
            dims = o.type.tensor_type.shape.dim
            return dims[-1].dim_value or None
    return None
