"""Early exit: compute up to the deepest layer a run reads, and no further.

``--layers`` decides, through one rule for every door (``early_exit`` in extraction/engine_plan.py: the
executors, ``embed``, the bench's rows and ``layerscope run``). ``depth_of(layers)`` is the deepest one (``-1``
when only ``raw`` is asked), and an engine handed ``depth`` (a hint every engine takes, engines/registry.py) runs

- ONNX Runtime / OpenVINO: a graph derived from the one it would load, pruned by ``onnx.utils.Extractor``
  to the outputs of layers ``raw``, ``0``..``depth`` and the in-graph pooled outputs of those layers (the
  pooling ``Concat`` re-pointed at the kept layers first, so no pooled output needs a deeper block).
  It is cached beside its source graph as ``<stem>.upto-<depth>.onnx`` (a graph with external data keeps
  pointing at the source's data file, in the same folder, so no weight is copied) with
  ``<stem>.upto-<depth>.json`` recording the source's content hash, the recipe, and the check that held the
  derived graph to the full graph's outputs (max |diff| per output, bit for bit or within the export's
  recorded tolerance). The record is held to the rule of model/derived.py before the graph runs: a changed
  source or recipe, a graph that is not the one recorded, or a record whose depth, pooled layers, outputs or
  nodes are not what this run computes and the graph itself holds, makes it again; a failed check or a folder
  that cannot be written leaves the engine on the full graph, saying so in its notes. A graph of pooled outputs only
  pools each layer as it is made instead of stacking every layer first (engines/layer_pooling.py). A run of
  every layer derives nothing: it runs the export's own graph (fetching its pooled outputs alone where that
  is all it reads), so its first start costs no derived graph, no check and, for a graph without external
  data, no copy of the weights.
- PyTorch: the first ``depth`` blocks only (engines/torch.py), where the model's anatomy (model/anatomy.py)
  says its blocks are; layer ``depth`` < L of a decoder is the block's own output, without the final norm that
  only layer L carries (the anatomy's final norm, replaced by an identity).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from layerscope.engines.parity_texts import PARITY_TEXTS
from layerscope.vocab.outputs import RAW_OUTPUT, hidden_index, output_layer, pooled_mode

RECIPE = 2  # bump when the derived graph is built differently: cached ones are made again
SUFFIX = ".upto-"


def depth_of(layers: Iterable[str]) -> int:
    """The deepest canonical layer in ``layers`` (``raw`` alone: -1)."""
    return max((-1 if str(n) == "raw" else int(n) for n in layers), default=-1)


def check_depth(layers: Iterable[str], depth: int | None, engine: str) -> None:
    """One line when a run asks an engine opened for layers up to ``depth`` for a deeper layer."""
    if depth is None:
        return
    deeper = [n for n in layers if str(n).isdigit() and int(n) > depth]  # not raw, not the model's own last state
    if deeper:
        from layerscope.errors import InputError

        top = "raw only" if depth < 0 else f"layers up to {depth}"
        raise InputError(f"engine '{engine}' was opened for {top} (depth={depth}) and was asked for layer "
                         f"{deeper[0]}; open it without depth, or with depth={max(int(n) for n in deeper)}")


def check_pooled_only(pooled_only: bool, engine: str) -> None:
    """One line when an engine whose graph hands back pooled vectors only is asked for token states."""
    if pooled_only:
        from layerscope.errors import InputError

        raise InputError(f"engine '{engine}' was opened for in-graph pooled vectors only (pooled_only=True) and "
                         "was asked for token states or a pooling the graph lacks; open it without pooled_only")


def kept_outputs(output_names: Iterable[str], depth: int, pooled_only: bool = False) -> list[str]:
    """The graph outputs a run up to ``depth`` keeps: raw embeddings, hidden states 0..depth, pooled outputs
    (``pooled_only``: the pooled outputs alone, the hidden states staying inside the graph)."""
    keep = []
    for name in output_names:
        index = hidden_index(name)
        if pooled_only:
            if pooled_mode(name) is not None:
                keep.append(name)
        elif name == RAW_OUTPUT or (index is not None and index <= depth) or pooled_mode(name) is not None:
            keep.append(name)
    return keep


def kept_pooled_layers(pooled_layers: Iterable[str], depth: int) -> list[str]:
    return [n for n in pooled_layers if n == "raw" or int(n) <= depth]


@dataclass(frozen=True)
class Truncated:
    """A derived graph an engine runs instead of its full one."""

    path: Path
    depth: int
    pooled_layers: tuple[str, ...]
    max_abs: float  # the worst |derived - full| over every kept output on the check's batches
    pooled_only: bool  # its outputs are the pooled ones alone
    nodes: int  # nodes in the derived graph
    full_nodes: int  # nodes in the graph it was derived from
    reused: bool  # found in the cache (False: made by this call)
    every_layer: bool = False  # depth is the model's last layer (a pooled-only graph of the whole model)

    def note(self) -> str:
        how = "bit for bit" if self.max_abs == 0 else f"max |diff| {self.max_abs:.3g}"
        top = "raw embeddings only" if self.depth < 0 else "every layer" if self.every_layer \
            else f"layers up to {self.depth}"
        top += ", pooled outputs only" if self.pooled_only else ""
        return (f"early exit: {top}, {self.path.name} ({self.nodes:,} nodes, the full graph {self.full_nodes:,}; equal to the "
                f"full graph {how}{', cached' if self.reused else ''})")


def derive(src: Path, depth: int, dst: Path, pooled_only: bool = False) -> tuple[list[str], int, int]:
    """Write the graph of ``src`` pruned to the outputs up to ``depth`` into ``dst`` (same folder as ``src``).
    Returns (its pooled layers, its node count, the source's node count)."""
    import onnx
    from onnx.utils import Extractor

    model = onnx.load(str(src), load_external_data=False)  # weights stay in the source's data file
    graph = model.graph
    names = [o.name for o in graph.output]
    keep = kept_outputs(names, depth, pooled_only)
    pooled = _repoint_stack(graph, depth) if any(pooled_mode(n) for n in keep) else []
    if any(pooled_mode(n) for n in keep) and not pooled:
        keep = [n for n in keep if pooled_mode(n) is None]  # the pooled outputs would need every layer
    if not keep:
        from layerscope.errors import EngineUnavailableError

        raise EngineUnavailableError(f"{src.name} has no pooled outputs of the layers up to {depth} to keep")
    for out in graph.output:
        if pooled_mode(out.name) is not None and pooled:
            out.type.tensor_type.shape.dim[0].dim_value = len(pooled)
    derived = Extractor(model).extract_model([i.name for i in graph.input], keep)
    if pooled_only:  # no token states leave the graph: each layer pooled as it is made (engines/layer_pooling.py)
        from layerscope.engines.layer_pooling import pool_each_layer

        pool_each_layer(derived.graph)
    derived.ir_version = model.ir_version
    del derived.metadata_props[:]
    derived.metadata_props.extend(model.metadata_props)
    save_derived(derived, dst)
    return pooled, len(derived.graph.node), len(graph.node)


def save_derived(model, dst: Path) -> None:
    """Write a derived graph whole or not at all: to a temporary name beside ``dst``, then renamed over it."""
    import onnx

    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    try:
        onnx.save(model, str(tmp))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _repoint_stack(graph, depth: int) -> list[str]:
    """Point the pooling's stacking ``Concat`` (of ``Unsqueeze(<layer output>)``, export/graph.py) at the
    layers up to ``depth``; the layers it then stacks, in order ([] when the graph has no such Concat)."""
    made_by = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if node.op_type != "Concat" or not node.input:
            continue
        layers = []
        for name in node.input:
            src = made_by.get(name)
            layer = output_layer(src.input[0]) if src is not None and src.op_type == "Unsqueeze" else None
            if layer is None:
                break
            layers.append(layer)
        else:
            kept = [(name, layer) for name, layer in zip(node.input, layers) if layer == "raw" or int(layer) <= depth]
            if not kept:
                return []
            del node.input[:]
            node.input.extend(name for name, _ in kept)
            return [layer for _, layer in kept]
    return []


def compare(full: list, got: list, names: list[str], full_pooled: list[str], pooled: list[str]) -> dict[str, float]:
    """Max |derived - full| per output name (pooled outputs: on the rows of the kept layers)."""
    import numpy as np

    rows = [full_pooled.index(layer) for layer in pooled]
    out = {}
    for name, f, g in zip(names, full, got):
        f = np.asarray(f, dtype=np.float64)
        g = np.asarray(g, dtype=np.float64)
        if pooled_mode(name) is not None:
            f = f[rows]
        out[name] = float(np.max(np.abs(f - g))) if f.shape == g.shape else float("inf")
    return out


def truncated_graph(src: Path, depth: int, *, num_layers: int, full_pooled: list[str], tolerance: float | None,
                    feeds: Callable[[], list[dict]], log: Callable[[str], None] = lambda m: None,
                    pooled_only: bool = False) -> Truncated | None:
    """The derived graph of ``src`` up to ``depth`` (``pooled_only``: with the pooled outputs alone): reused from
    the cache when its record matches the source's content and this recipe, else made and checked against
    ``src`` on the batches ``feeds()`` returns. None when there is nothing to prune (``depth`` >= ``num_layers``
    and every output kept) or it cannot be used (``log`` says why)."""
    depth = min(int(depth), num_layers)
    if depth >= num_layers and not pooled_only:
        return None
    src = Path(src)
    dst = src.with_name(f"{src.stem}{SUFFIX}{'raw' if depth < 0 else depth}{'.pooled' if pooled_only else ''}.onnx")
    rec = dst.with_suffix(".json")
    from layerscope.model.derived import source_sha256

    key = source_sha256(src)
    bar = 0.0 if tolerance is None else float(tolerance)
    found = _cached(dst, rec, src, key, depth, pooled_only, kept_pooled_layers(full_pooled, depth), bar)
    if found is not None:
        return replace(found, every_layer=depth == num_layers)
    if not os.access(src.parent, os.W_OK):
        log(f"early exit off: {src.parent} is not writable, so the graph up to layer {depth} cannot be cached there")
        return None
    from layerscope.ownership import writing

    with writing(src.parent, "export") as wrote:
        wrote.add(dst.name, rec.name)  # named before they are written
        try:
            pooled, nodes, full_nodes = derive(src, depth, dst, pooled_only)
            names = kept_outputs(_outputs(dst), depth, pooled_only)
            diffs = check_outputs(src, dst, names, full_pooled, pooled, feeds())
            worst = max(diffs.values(), default=0.0)
            why = None if worst <= bar else f"differs from the full graph by {worst:.3g} (> {bar:g})"
        except Exception as exc:  # noqa: BLE001 - onnx and the runtimes raise untyped errors: the full graph runs
            why = f"could not be made ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
        if why:
            dst.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
            log(f"early exit off: the graph up to layer {depth} {why}; the full graph runs")
            return None
        from layerscope.model.derived import write_record

        write_record(rec, dst, recipe=RECIPE, source=src, source_digest=key, depth=depth, pooled_only=pooled_only,
                     outputs=names, pooled_layers=pooled, nodes=nodes, full_nodes=full_nodes,
                     check={"texts": "engines/parity_texts.py PARITY_TEXTS", "runtime": "onnxruntime CPU",
                            "tolerance_abs": bar, "max_abs": worst,
                            "outputs": {n: {"max_abs": d} for n, d in diffs.items()}})
    return Truncated(dst, depth, tuple(pooled), worst, pooled_only, nodes, full_nodes, reused=False,
                     every_layer=depth == num_layers)


def _outputs(path: Path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def _cached(dst: Path, rec: Path, src: Path, key: str, depth: int, pooled_only: bool, pooled: list[str],
            bar: float) -> Truncated | None:
    """The cached graph where its record holds by the rule (model/derived.py): made by this recipe from ``src``
    as it is now, the graph as recorded, and what the record says (depth, the layers of its pooled rows, its
    outputs and nodes) both what this run computes it must be and what the graph itself holds; else None."""
    from layerscope.model.derived import finite_at_most, graph_facts, read_record

    data = read_record(rec, dst, recipe=RECIPE, source=src, source_digest=key,
                       claims={"depth": depth, "pooled_only": pooled_only})
    if data is None:
        return None
    try:
        outputs, stacked, nodes, _ = graph_facts(dst)
    except Exception:  # noqa: BLE001 - a graph onnx cannot parse is made again
        return None
    has_pooled = any(pooled_mode(n) is not None for n in outputs)
    claimed = data.get("pooled_layers")
    check = data.get("check")
    if claimed != (pooled if has_pooled else []) or (has_pooled and stacked != pooled) \
            or data.get("outputs") != outputs or data.get("nodes") != nodes or not isinstance(check, dict) \
            or not finite_at_most(check.get("max_abs"), bar) or not isinstance(data.get("full_nodes"), int):
        return None
    return Truncated(dst, depth, tuple(pooled if has_pooled else ()), float(check["max_abs"]), pooled_only, nodes,
                     int(data["full_nodes"]), reused=True)


def check_outputs(src: Path, dst: Path, names: list[str], full_pooled: list[str], pooled: list[str],
           feeds: list[dict]) -> dict[str, float]:
    """Worst |derived - full| per output over ``feeds``, both graphs on ONNX Runtime's CPU provider in turn
    (one session in memory at a time)."""
    from layerscope.engines.ort_session import make_session

    def outputs(path: Path) -> list[list]:
        session = make_session(path, "CPUExecutionProvider")
        inputs = {i.name: i.type for i in session.get_inputs()}
        got = [session.run(names, _typed(feed, inputs)) for feed in feeds]
        del session
        return got

    full = outputs(src)
    derived = outputs(dst)
    worst: dict[str, float] = {n: 0.0 for n in names}
    for f, d in zip(full, derived):
        diffs = compare(f, d, names, full_pooled, pooled)
        worst = {n: max(worst[n], diffs[n]) for n in names}
    return worst


def _typed(feed: dict, inputs: dict) -> dict:
    import numpy as np

    return {name: np.ascontiguousarray(feed[name].astype(np.int32) if kind == "tensor(int32)" else feed[name])
            for name, kind in inputs.items()}


def block_slot(net, anatomy, why: str) -> tuple[object, str]:
    """(parent module, attribute name) of the model's blocks as its anatomy records them (``anatomy.blocks``,
    model/anatomy.py; read the attribute again after ``truncate_blocks``, which replaces the list)."""
    if anatomy is None or anatomy.blocks is None:
        from layerscope.errors import EngineUnavailableError

        raise EngineUnavailableError(f"{type(net).__name__} keeps no list of blocks (one block shared by every layer) "
                                     f"{why}")
    owner, _, attr = anatomy.blocks.rpartition(".")
    return (net.get_submodule(owner) if owner else net), attr


def truncate_blocks(net, anatomy, depth: int, *, probe: Callable[[], object]) -> int:
    """Keep only the first ``depth`` blocks of a Hugging Face model (in place; the others' weights are freed);
    returns how many blocks it kept.

    The blocks are the anatomy's. Where layer L carries the final norm (decoders, T5: the anatomy's
    ``final_norm_in_hidden_states``), that norm belongs to layer L only: below L the anatomy's final norm is
    replaced by an identity, so hidden state ``depth`` is block ``depth``'s own output as in the full model.
    For ``depth`` <= 0, ``probe()`` (a forward pass) tells whether the model runs with no block at all; one
    that cannot (DeBERTa-v2 reads its last block's output) keeps its first block."""
    import torch

    parent, attr = block_slot(net, anatomy, "to stop early")
    blocks = getattr(parent, attr)
    if anatomy.final_norm and anatomy.final_norm_in_hidden_states and depth < anatomy.num_blocks:
        owner, _, name = anatomy.final_norm.rpartition(".")
        setattr(net.get_submodule(owner) if owner else net, name, torch.nn.Identity())
    kept = torch.nn.ModuleList(list(blocks)[:max(depth, 1)])
    setattr(parent, attr, kept)
    if depth <= 0:
        setattr(parent, attr, torch.nn.ModuleList())
        try:
            probe()
        except Exception:  # noqa: BLE001 - the model's own code fails without a block: it keeps one
            setattr(parent, attr, kept)
            return 1
    return max(depth, 0)


def engine_graph(engine, path: Path, depth: int | None, pooled_only: bool) -> tuple[Path, list[str]]:
    """The graph an ONNX engine runs for layers up to ``depth`` (``pooled_only``: fetching only the in-graph
    pooled outputs) and the layers its pooled outputs stack: the derived graph where it prunes anything and
    passed its check (the engine's ``depth``, ``pooled_only`` and notes then say so), else ``path`` itself."""
    from layerscope.errors import EngineUnavailableError

    manifest = engine.manifest
    full = list(manifest.pooled_layers)
    pooled_only = bool(pooled_only) and engine.in_graph_pooling and bool(manifest.pooled_modes)
    depth = manifest.num_layers if depth is None else int(depth)
    if depth >= manifest.num_layers:  # every layer: the export's own graph (its pooled outputs fetched alone when
        return path, full  # that is all the run reads); no derived copy to build, check and keep beside it
    try:
        cut = truncated_graph(path, depth, num_layers=manifest.num_layers, full_pooled=full,
                              tolerance=manifest.parity.tolerance_abs if manifest.parity else None,
                              feeds=lambda: probe_feeds(engine), log=engine.info.notes.append,
                              pooled_only=pooled_only)
    except EngineUnavailableError as exc:  # no ONNX Runtime to hold the derived graph to the full one
        engine.info.notes.append(f"early exit off: {exc}")
        return path, full
    if cut is None:
        return path, full
    engine.depth = None if cut.every_layer else cut.depth
    engine.pooled_only = cut.pooled_only
    engine.info.notes.append(cut.note())
    return cut.path, list(cut.pooled_layers)


def probe_feeds(engine) -> list[dict]:
    """Inputs of the texts a derived graph is checked on (padding, scripts, a long text)."""
    encoder = engine.encoder()
    return [encoder(list(PARITY_TEXTS[:4])).inputs, encoder([PARITY_TEXTS[4]]).inputs]
