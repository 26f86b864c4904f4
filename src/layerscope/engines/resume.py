"""Resume at layer j: write a hidden state at one layer and run the layers after it, on every engine.

Layer names are the house's (``0`` the embeddings' output, ``1..L`` block i's output); writing a state "at
layer j" replaces ``hidden_states.j`` as the model reports it (block j's output; layer L of a decoder is the
final norm's output, as its hidden states hold it). ``Engine.resume(batch, j, state, layers)`` hands back the
hidden states of ``layers`` (default: L) computed from ``state`` (``[batch, tokens, hidden]``, float32) at layer
j and the batch's mask and positions; layer L resumes to itself.

- ONNX Runtime / OpenVINO: a graph derived from the export's (``<stem>.from-<j>.onnx``): the tensor
  ``hidden_states.j`` becomes a graph input and ``onnx.utils.Extractor`` keeps what ``hidden_states.j+1..L``
  need from it and from the model's inputs (the attention mask, the positions; a decoder's graph may still read
  ``input_ids`` for a shape). Inputs nothing reads are dropped. Weights are not copied per layer: an export
  that keeps its weights inside ``model.onnx`` gets them written once to ``<stem>.resume.data``, which every
  derived graph reads as external data (an export with external data keeps reading its own file). Each graph is
  cached beside its source with ``<stem>.from-<j>.json``: the source's content hash, the recipe, the graph's and
  the data file's sha256, the inputs and outputs, and the check; a changed source, recipe, graph or data file,
  or a record that does not read, makes it again. The check (on engines/parity_texts.py, right- and
  left-padded) feeds each batch's own layer-j state back and holds layers j+1..L to the full graph's within the
  export's recorded tolerance, then feeds the same states with other token ids (one id at every real
  position): a graph that still reads the ids past layer j fails it. A graph that fails is removed and the
  engine refuses to write states, in one line.
- PyTorch (engines/torch.py ``TorchEngine._resume``): a forward pre-hook on block j+1 hands it ``state`` in place
  of its input; the blocks before it still run (their output is discarded).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from layerscope.errors import EngineUnavailableError, InputError
from layerscope.vocab.outputs import hidden_index, hidden_output

if TYPE_CHECKING:
    import numpy as np

RECIPE = 1  # bump when the derived graph is built differently: cached ones are made again
SUFFIX = ".from-"
DATA_SUFFIX = ".resume.data"
SHARE_FROM = 1024  # initializers of at least this many bytes are read from the shared data file
ALIGN = 64  # each tensor's offset in the shared data file


class CannotResume(EngineUnavailableError):
    """A resume graph that cannot be made or did not pass its check (the message says which and why)."""


@dataclass(frozen=True)
class ResumeGraph:
    """A derived graph that runs the layers after ``layer`` from a state written at it."""

    path: Path
    layer: int
    inputs: tuple[str, ...]  # the graph's inputs: the state (``hidden_states.<layer>``) and the model inputs it reads
    outputs: tuple[str, ...]  # hidden_states.<layer+1> .. hidden_states.<L>
    max_abs: float  # the worst |derived - full| over every output on the check's batches (ids kept and replaced)
    nodes: int
    full_nodes: int
    reused: bool

    def note(self) -> str:
        how = "bit for bit" if self.max_abs == 0 else f"max |diff| {self.max_abs:.3g}"
        return (f"resume at layer {self.layer}: {self.path.name} ({self.nodes:,} nodes, the full graph "
                f"{self.full_nodes:,}; equal to the full graph {how}{', cached' if self.reused else ''})")


def check_write(num_layers: int, hidden_size: int, layer: Any, state, batch) -> int:
    """``layer`` as an int when a state may be written there and ``state`` fits ``batch``; else one line saying
    what to fix (a layer outside the model, a state of another width or shape)."""
    import numpy as np

    try:
        j = int(layer)
    except (TypeError, ValueError):
        raise InputError(f"layer {layer!r} is not a layer number; write a state at a layer 0..{num_layers}") from None
    if str(layer) == "raw" or not 0 <= j <= num_layers:
        raise InputError(f"layer {layer} is outside the model: a state is written at a layer 0..{num_layers}")
    shape = tuple(np.shape(state))
    want = (*np.shape(batch.mask), int(hidden_size))
    if len(shape) != 3 or shape[-1] != int(hidden_size):
        width = shape[-1] if shape else "none"
        raise InputError(f"a state of width {width} (shape {shape}) cannot be written into this model: its layers "
                         f"are {hidden_size} wide ([batch, tokens, {hidden_size}])")
    if shape != want:
        raise InputError(f"a state of shape {shape} does not fit the batch it is written into ({want})")
    return j


def resume_layers(num_layers: int, layer: int, layers) -> list[int]:
    """The layers a resume from ``layer`` hands back (default: the last); one line for a layer it cannot."""
    want = [num_layers] if layers is None else [int(x) for x in layers]
    bad = [x for x in want if not layer <= x <= num_layers]
    if bad:
        raise InputError(f"a state written at layer {layer} gives layers {layer}..{num_layers}, not {bad[0]}")
    return want


# --------------------------------------------------------------------------------------------- the ONNX graph

def _extract(src: Path, layer: int, num_layers: int):
    """The derived model (in memory, weights still where the source keeps them) and the source's node count."""
    import onnx
    from onnx.utils import Extractor

    model = onnx.load(str(src), load_external_data=False)
    graph = model.graph
    state = hidden_output(layer)
    have = {o.name for o in graph.output}
    outputs = [hidden_output(k) for k in range(layer + 1, num_layers + 1)]
    missing = [n for n in [state, *outputs] if n not in have]
    if missing:
        raise CannotResume(f"{src.name} has no output {missing[0]}: the export does not hand back every layer")
    derived = Extractor(model).extract_model([i.name for i in graph.input] + [state], outputs)
    read = _names_read(derived.graph)
    kept = [i for i in derived.graph.input if i.name in read]
    if state not in {i.name for i in kept}:
        raise CannotResume(f"layers {layer + 1}..{num_layers} of {src.name} do not read hidden_states.{layer}")
    del derived.graph.input[:]
    derived.graph.input.extend(kept)
    derived.ir_version = model.ir_version
    del derived.metadata_props[:]
    derived.metadata_props.extend(model.metadata_props)
    return derived, len(graph.node)


def _names_read(graph) -> set[str]:
    """Every tensor name a node of ``graph`` (or of a subgraph inside one) reads."""
    read: set[str] = set()
    for node in graph.node:
        read.update(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                read |= _names_read(sub)
    return read


def _layout(model) -> dict[str, tuple[int, int]]:
    """Where each initializer the source keeps inside itself (``raw_data`` of ``SHARE_FROM`` bytes or more) sits
    in the shared data file: {name: (offset, length)}, in the source's order (the same for every derived graph)."""
    out, offset = {}, 0
    for init in model.graph.initializer:
        size = len(init.raw_data)
        if size >= SHARE_FROM:
            offset = -(-offset // ALIGN) * ALIGN
            out[init.name] = (offset, size)
            offset += size
    return out


def _placed(model, layout: dict[str, tuple[int, int]]):
    """``(initializer, (offset, length))`` of each initializer of ``model`` the shared data file holds."""
    for init in model.graph.initializer:
        where = layout.get(init.name)
        if where is not None:
            yield init, where


def _write_data(model, path: Path, layout: dict[str, tuple[int, int]]) -> None:
    """Write the shared data file whole (to a temporary name, then renamed over ``path``)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for init, (offset, _) in _placed(model, layout):
                f.seek(offset)
                f.write(init.raw_data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _point_at_data(derived, layout: dict[str, tuple[int, int]], data_name: str) -> None:
    from onnx import TensorProto

    for init in derived.graph.initializer:
        where = layout.get(init.name)
        if where is None or not init.raw_data:
            continue
        init.ClearField("raw_data")
        del init.external_data[:]
        for k, v in (("location", data_name), ("offset", str(where[0])), ("length", str(where[1]))):
            entry = init.external_data.add()
            entry.key, entry.value = k, v
        init.data_location = TensorProto.EXTERNAL


def derive(src: Path, layer: int, num_layers: int, dst: Path) -> tuple[list[str], list[str], int, int, str | None]:
    """Write the resume graph of ``src`` at ``layer`` into ``dst`` (beside ``src``), its weights read from the
    shared data file (written first where it is missing or not the source's). Returns (inputs, outputs, its node
    count, the source's, the data file's name or None where the source keeps none inside itself)."""
    import onnx

    from layerscope.engines.truncate import save_derived

    derived, full_nodes = _extract(src, layer, num_layers)
    source = onnx.load(str(src), load_external_data=False)
    layout = _layout(source)
    data_name = None
    if layout:
        data = src.with_name(src.stem + DATA_SUFFIX)
        data_name = data.name
        if not _data_holds(data, source, layout):
            _write_data(source, data, layout)
        _point_at_data(derived, layout, data_name)
    del source
    save_derived(derived, dst)
    return ([i.name for i in derived.graph.input], [o.name for o in derived.graph.output], len(derived.graph.node),
            full_nodes, data_name)


def _data_holds(path: Path, source, layout: dict[str, tuple[int, int]]) -> bool:
    """Whether the shared data file at ``path`` holds the source's tensors where ``layout`` puts them."""
    if not path.is_file():
        return False
    end = max(o + n for o, n in layout.values())
    if path.stat().st_size != end:
        return False
    with open(path, "rb") as f:
        for init, (offset, length) in _placed(source, layout):
            f.seek(offset)
            if f.read(length) != init.raw_data:
                return False
    return True


# ------------------------------------------------------------------------------------------------- the check

def reference_states(src: Path, feeds: list[dict], num_layers: int) -> list[list[np.ndarray]]:
    """Every layer's hidden states (0..L) of each feed through the full graph on ONNX Runtime's CPU provider."""
    from layerscope.engines.ort_session import make_session
    from layerscope.engines.truncate import _typed
    from layerscope.vocab.outputs import hidden_outputs

    session = make_session(src, "CPUExecutionProvider")
    inputs = {i.name: i.type for i in session.get_inputs()}
    got = [session.run(hidden_outputs(num_layers), _typed(feed, inputs)) for feed in feeds]
    del session
    return got


def resume_feed(inputs: dict[str, str], layer: int, state, model_inputs: dict) -> dict:
    """The feed of a resume graph (its inputs and their ONNX types): the state and the model inputs it reads."""
    import numpy as np

    feed = {}
    for name, kind in inputs.items():
        if name == hidden_output(layer):
            feed[name] = np.ascontiguousarray(np.asarray(state, dtype=np.float32))
        elif name not in model_inputs:
            raise CannotResume(f"the resume graph at layer {layer} reads {name}, which the batch does not hold")
        else:
            value = np.asarray(model_inputs[name])
            feed[name] = np.ascontiguousarray(value.astype(np.int32) if kind == "tensor(int32)" else value)
    return feed


def check_resume(dst: Path, layer: int, reference: list[list[np.ndarray]], feeds: list[dict],
                 other_id: int) -> dict[str, float]:
    """Worst |resumed - full| per output of the resume graph at ``dst`` over ``feeds`` (``reference``: the full
    graph's states of each, layers 0..L), fed each batch's own state with its ids and with ``other_id`` at every
    real token; a graph whose outputs move with the ids is reported as such (CannotResume)."""
    import numpy as np

    from layerscope.engines.ort_session import make_session

    session = make_session(dst, "CPUExecutionProvider")
    inputs = {i.name: i.type for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    worst = {n: 0.0 for n in names}
    moved = 0.0
    for feed, states in zip(feeds, reference):
        other = dict(feed)
        if "input_ids" in feed:
            other["input_ids"] = np.where(np.asarray(feed["attention_mask"]) > 0, other_id, feed["input_ids"])
        for which, given in (("ids", feed), ("other", other)):
            outs = session.run(names, resume_feed(inputs, layer, states[layer], given))
            for name, out in zip(names, outs):
                want = np.asarray(states[hidden_index(name)], dtype=np.float64)
                diff = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - want))) if out.shape == want.shape \
                    else float("inf")
                if which == "ids":
                    worst[name] = max(worst[name], diff)
                else:
                    moved = max(moved, diff)
    del session
    worst["with other token ids"] = moved
    return worst


def left_padded(feed: dict) -> dict:
    """``feed`` (right-padded) with each row's tokens moved to the right end and its positions counted from its
    first real token, as a left-padding tokenizer makes it."""
    import numpy as np

    mask = np.asarray(feed["attention_mask"])
    shift = mask.shape[1] - mask.sum(axis=1)
    out = {}
    for name, value in feed.items():
        value = np.asarray(value)
        out[name] = np.stack([np.roll(row, int(s)) for row, s in zip(value, shift)])
    if "position_ids" in out:
        out["position_ids"] = np.clip(np.cumsum(out["attention_mask"], axis=1) - 1, 0, None).astype(np.int64)
    return out


# ------------------------------------------------------------------------------------------------ the cache

def resume_graph(src: Path, layer: int, *, num_layers: int, tolerance: float | None, feeds: Callable[[], list[dict]],
                 other_id: int, reference: Callable[[list[dict]], list[list[np.ndarray]]] | None = None) -> ResumeGraph:
    """The resume graph of ``src`` at ``layer``: reused from the cache when its record matches the source's content,
    this recipe, its own and its data file's bytes, else made and checked against ``src`` on ``feeds()``
    (``reference(feeds)``: their full-graph states, computed once by a caller that makes several layers).
    CannotResume (saying why) where it cannot be made, the folder cannot be written, or the check fails."""
    from layerscope.engines.truncate import content_hash

    src = Path(src)
    dst = src.with_name(f"{src.stem}{SUFFIX}{int(layer)}.onnx")
    rec = dst.with_suffix(".json")
    key = content_hash(src)
    found = _cached(dst, rec, key, layer)
    if found is not None:
        return found
    if not os.access(src.parent, os.W_OK):
        raise CannotResume(f"{src.parent} is not writable, so the graph resuming at layer {layer} cannot be "
                           "cached there")
    from layerscope.ownership import writing

    bar = 0.0 if tolerance is None else float(tolerance)
    data = src.with_name(src.stem + DATA_SUFFIX)
    with writing(src.parent, "export") as wrote:
        wrote.add(dst.name, rec.name, data.name)  # named before they are written
        try:
            inputs, outputs, nodes, full_nodes, data_name = derive(src, layer, num_layers, dst)
            given = feeds()
            ref = reference(given) if reference is not None else reference_states(src, given, num_layers)
            diffs = check_resume(dst, layer, ref, given, other_id)
        except CannotResume:
            dst.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
            raise
        except Exception as exc:  # noqa: BLE001 - onnx and the runtimes raise untyped errors
            dst.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
            raise CannotResume(f"the graph resuming at layer {layer} could not be made ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
        worst = max(diffs.values(), default=0.0)
        if not worst <= bar:
            dst.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
            what = max(diffs, key=diffs.get)
            raise CannotResume(f"the graph resuming at layer {layer} differs from the full graph by {worst:.3g} "
                               f"(> {bar:g}) at {what}" + ("; it reads the token ids past that layer"
                                                            if what == "with other token ids" else ""))
        from layerscope.jsonfile import write_json_atomic
        from layerscope.model.identity import hash_files

        write_json_atomic(rec, {
            "recipe": RECIPE, "layer": int(layer), "source": src.name, "source_sha256": key,
            "sha256": hash_files([dst]), "data": data_name,
            "data_sha256": hash_files([src.parent / data_name]) if data_name else None,
            "inputs": inputs, "outputs": outputs, "nodes": nodes, "full_nodes": full_nodes,
            "check": {"texts": "engines/parity_texts.py PARITY_TEXTS, right- and left-padded",
                      "runtime": "onnxruntime CPU", "tolerance_abs": bar, "max_abs": worst,
                      "outputs": {n: {"max_abs": d} for n, d in diffs.items()}}})
    return ResumeGraph(dst, int(layer), tuple(inputs), tuple(outputs), worst, nodes, full_nodes, reused=False)


def _cached(dst: Path, rec: Path, key: str, layer: int) -> ResumeGraph | None:
    """The cached graph where its record reads and matches (None: make it again)."""
    from layerscope.model.identity import hash_files

    try:
        data = json.loads(rec.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not dst.is_file():
            return None
        names = [data.get("inputs"), data.get("outputs")]
        if not all(isinstance(x, list) and all(isinstance(n, str) for n in x) for x in names):
            return None
        data_name = data.get("data")
        if data_name is not None:
            if not isinstance(data_name, str) or data_name != dst.with_name(
                    dst.name.split(SUFFIX)[0] + DATA_SUFFIX).name or not (dst.parent / data_name).is_file():
                return None
            if data.get("data_sha256") != hash_files([dst.parent / data_name]):
                return None
        if not (data.get("recipe") == RECIPE and data.get("source_sha256") == key and data.get("layer") == layer
                and data.get("sha256") == hash_files([dst])):
            return None
        check = data["check"]
        return ResumeGraph(dst, layer, tuple(names[0]), tuple(names[1]), float(check["max_abs"]),
                           int(data["nodes"]), int(data["full_nodes"]), reused=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------------ the ONNX engines

class OnnxResume:
    """An ONNX engine's resume graphs: derived from the graph it was opened on (``source``), made or found per
    layer when first asked, one session at a time (``open_graph`` makes it on the engine's runtime)."""

    def __init__(self, engine, source: Path, open_graph: Callable[[Path], Any]):
        self.engine = engine
        self.source = Path(source)
        self.open_graph = open_graph
        self._graphs: dict[int, ResumeGraph] = {}
        self._session: tuple[int, Any, dict[str, str]] | None = None
        self._reference = None

    def graph(self, layer: int) -> ResumeGraph:
        if layer not in self._graphs:
            from layerscope.engines.truncate import probe_feeds

            manifest = self.engine.manifest
            feeds = lambda: self._feeds(probe_feeds)  # noqa: E731
            got = resume_graph(self.source, layer, num_layers=manifest.num_layers,
                               tolerance=manifest.parity.tolerance_abs if manifest.parity else None, feeds=feeds,
                               other_id=self.engine.encoder().fallback_token_id, reference=self._states)
            self._graphs[layer] = got
            self.engine.info.notes.append(got.note())
        return self._graphs[layer]

    def _feeds(self, probe_feeds) -> list[dict]:
        feeds = probe_feeds(self.engine)
        return feeds + [left_padded(feeds[0])]

    def _states(self, feeds: list[dict]):
        """The full graph's states of the check's feeds, computed once for every layer made in this process."""
        if self._reference is None:
            self._reference = reference_states(self.source, feeds, self.engine.manifest.num_layers)
        return self._reference

    def run(self, batch, layer: int, state, layers: list[int]) -> list[np.ndarray]:
        import numpy as np

        graph = self.graph(layer)
        if self._session is None or self._session[0] != layer:
            self._session = None  # one resume session held at a time
            session = self.open_graph(graph.path)
            self._session = (layer, session, {i.name: i.type for i in session.get_inputs()})
        _, session, inputs = self._session
        outs = session.run([hidden_output(k) for k in layers], resume_feed(inputs, layer, state, batch.inputs))
        return [np.asarray(o, dtype=np.float32) for o in outs]

    def close(self) -> None:
        self._session = None
