"""Derived graphs: what layerscope makes from an export and keeps beside it, and the one rule their records follow.

An engine does not always run the export's own ``model.onnx``. Early exit prunes it to the layers a run reads
(``<stem>.upto-<d>.onnx``, engines/truncate.py), a run of pooled vectors only pools each layer as it is made
(``<stem>.upto-<d>.pooled.onnx``, engines/layer_pooling.py), long texts run attention in blocks of query rows
(``<stem>.blocked.onnx``, engines/blocked.py), the lens decodes with the head alone (``lens-k<k>.onnx``,
decoding/lens_onnx.py, its sidecar model/lens_record.py), a written state runs the layers after it
(``<stem>.from-<j>.onnx`` and the weights they share, ``<stem>.resume.data``: engines/resume.py), the analyses
that write states read logits through the head (``head-logits.onnx``, decoding/head_graph.py, its record
model/head_record.py), the attention analyses read every layer's
attention (``model.attn.onnx``, export/attention_variant.py) and ``layerscope optimize`` makes the precision
variants (``model.int8.onnx``, ...: export/variants.py), each with its entry in manifest.json. Each is made once,
checked against what it was made from, and read by later runs beside a record of what it is.

**The rule.** A record decides what is computed (which layer each pooled row is, which graph runs, whose
weights a graph holds), and it lies on disk where a user may edit it, copy another export over it, or rewrite
its source in place. So whatever a derived graph's record says is checked, before the graph is used, against

* the graph itself: its sha256 (and its external data's), and each claim that decides a result read again
  from the graph (the layers its pooled outputs stack, its outputs, its node count);
* its source: the content of the graph (or export) it was made from, hashed now (``source_sha256``);
* this version: the recipe that makes it;

and where anything differs, or the record is missing, damaged or not a JSON object, the graph is made again.
A record that is not a regular file (a FIFO) is one line, never opened blocking. ``layerscope verify`` runs the
same checks over every derived graph of an export (``verify_derived``). A new kind of derived file reads and
writes its record through ``read_record`` / ``write_record`` (or checks its own record type the same way, as
the lens sidecar and the attention entry do here) and joins ``verify_derived``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from layerscope.errors import ManifestError

RECORD_BYTES = 4 * 2**20  # a derived graph's record is a few KB
_PLAIN = re.compile(r"[^/\\\x00]+")


def plain_name(value: object) -> bool:
    """A file name read from a record that stays in its folder: no separator, not ``.``/``..``."""
    return isinstance(value, str) and bool(_PLAIN.fullmatch(value)) and value not in (".", "..")


def external_locations(path: Path) -> list[str]:
    """The external data files graph ``path`` reads, in order; ManifestError where one lies outside its folder."""
    import onnx
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors

    model = onnx.load(str(path), load_external_data=False)
    locations = sorted({e.value for t in _get_all_tensors(model)
                        if t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL
                        for e in t.external_data if e.key == "location"})
    root = path.parent.resolve()
    for loc in locations:
        if root not in (path.parent / loc).resolve().parents:
            raise ManifestError(f"{path} names external data {loc!r} outside its folder; re-run layerscope export")
    return locations


def source_sha256(src: Path) -> str:
    """The content hash of graph ``src`` and its external data files (remembered by stat signature,
    model/identity.py): what a derived graph records of its source, and compares again before it is used."""
    from layerscope.model.identity import hash_files

    src = Path(src)
    return hash_files([src] + [src.parent / loc for loc in external_locations(src)])


def graph_sha256(path: Path) -> str:
    from layerscope.model.identity import hash_files

    return hash_files([Path(path)])


def _load_record(record: Path) -> Any:
    """The JSON in ``record``; None where missing, too large or not JSON (made again); a record that is not a
    regular file is one line (jsonfile.py)."""
    from layerscope.jsonfile import JsonFileError, read_json

    try:
        return read_json(record, limit=RECORD_BYTES, what="derived graph's record")
    except FileNotFoundError:
        return None
    except JsonFileError:
        return None


def read_record(record: Path, graph: Path, *, recipe: int, source: Path, source_digest: str,
                claims: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The record of derived ``graph`` where every check of the rule holds: a JSON object, made by ``recipe``,
    from ``source`` whose content hashes to ``source_digest`` now, the graph's sha256 as recorded, and each of
    ``claims`` (what the caller computes the record must say) as recorded. None: make the graph again. The
    claims a caller reads from the graph itself are its own to compare (``stacked_layers``, ``graph_facts``)."""
    from layerscope.jsonfile import check_regular

    record, graph = Path(record), Path(graph)
    data = _load_record(record)
    if not isinstance(data, dict):
        return None
    if data.get("recipe") != recipe or data.get("source") != Path(source).name \
            or data.get("source_sha256") != source_digest:
        return None
    if any(data.get(key) != value for key, value in (claims or {}).items()):
        return None
    try:
        check_regular(graph)  # a FIFO or a device: one line (NotRegularFile), never opened blocking
    except FileNotFoundError:
        return None
    try:
        external_locations(graph)  # the weights it reads: inside its folder
    except Exception:  # noqa: BLE001 - one leading out, or a graph onnx cannot parse: made again
        return None
    if data.get("sha256") != graph_sha256(graph):
        return None
    return data


def write_record(record: Path, graph: Path, *, recipe: int, source: Path, source_digest: str,
                 **fields: Any) -> dict[str, Any]:
    """Write the record of derived ``graph`` (its sha256 taken now) atomically; returns what was written."""
    from layerscope.jsonfile import write_json_atomic

    data = {"recipe": recipe, "source": Path(source).name, "source_sha256": source_digest,
            "sha256": graph_sha256(graph), **fields}
    write_json_atomic(Path(record), data)
    return data


def data_problem(record: Path, data: Mapping[str, Any]) -> str | None:
    """Why the shared weights file a record names (``data``, with its ``data_sha256``) is not the one recorded, or
    None (also where the record names none): a name beside the record, a regular file, its recorded sha256."""
    name = data.get("data")
    if name is None:
        return None
    if not plain_name(name):
        return f"{Path(record).name} names its weights file {name!r}, not a file beside it"
    path = Path(record).parent / name
    if not path.is_file():
        return f"{Path(record).name}: {name} is missing"
    if data.get("data_sha256") != graph_sha256(path):
        return f"{name} is not the weights file {Path(record).name} records (sha256 differs): damaged or replaced"
    return None


def finite_at_most(value: object, bar: float) -> bool:
    """A recorded check's worst difference: a finite number within ``bar``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value <= bar


# ---------------------------------------------------------------- reading claims back from a graph

def stacked_layers(graph) -> list[str] | None:
    """The layers, in order, whose rows a graph's pooled outputs hold, read from the graph itself (None: it has
    no pooled outputs, or none built the way layerscope builds them). Two forms: the export's, a ``Concat`` of
    ``Unsqueeze(<layer output>)`` that the poolings read (export/graph.py); and a graph that pools each layer as
    it is made (engines/layer_pooling.py), whose pooled outputs gather from a ``Concat`` of per-layer rows, each
    computed from one ``Unsqueeze(<layer output>)``."""
    from layerscope.vocab.outputs import output_layer, pooled_mode

    made_by = {out: node for node in graph.node for out in node.output}

    def unsqueezed_layer(name: str) -> str | None:
        node = made_by.get(name)
        return output_layer(node.input[0]) if node is not None and node.op_type == "Unsqueeze" and node.input \
            else None

    for node in graph.node:
        if node.op_type == "Concat" and node.input and all(unsqueezed_layer(n) is not None for n in node.input):
            return [unsqueezed_layer(n) for n in node.input]
    pooled = [o.name for o in graph.output if pooled_mode(o.name) is not None]
    gather = made_by.get(pooled[0]) if pooled else None
    stack = made_by.get(gather.input[0]) if gather is not None and gather.op_type == "Gather" else None
    if stack is None or stack.op_type != "Concat":
        return None
    order = []
    for name in stack.input:  # each entry: the layers whose Unsqueeze it reads, walking back no further
        seen, todo, layers = set(), [name], set()
        while todo:
            here = todo.pop()
            if here in seen:
                continue
            seen.add(here)
            layer = unsqueezed_layer(here)
            if layer is not None:
                layers.add(layer)
                continue
            node = made_by.get(here)
            if node is not None:
                todo.extend(i for i in node.input if i)
        if len(layers) != 1:
            return None
        order.append(layers.pop())
    return order


def graph_facts(path: Path) -> tuple[list[str], list[str] | None, int, dict[str, int]]:
    """(outputs, the layers its pooled outputs stack, node count, node count by op type) of graph ``path``,
    loaded without its external data."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ops: dict[str, int] = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return [o.name for o in graph.output], stacked_layers(graph), len(graph.node), ops


# ---------------------------------------------------------------- the records of the other kinds

def variant_problem(export_dir: Path, manifest, kind: str) -> str | None:
    """Why the export's variant ``kind`` (its entry in manifest.json: ``layerscope optimize``) cannot be used as it
    is, or None: its graph or its weights missing or not their recorded sha256, or made for another
    ``model.onnx`` than the export's now (``source_sha256``; an entry made before it was recorded has its files
    checked alone)."""
    entry = manifest.variant(kind)
    if entry is None:
        return f"the export has no variant '{kind}'"
    from layerscope.jsonfile import NotRegularFile, check_regular
    from layerscope.model.manifest_check import member

    path = member(Path(export_dir), entry.file, f"variant {kind!r} file")
    try:
        check_regular(path)
    except FileNotFoundError:
        return f"{entry.file} is missing"
    except NotRegularFile as exc:
        return str(exc)
    source = entry.raw.get("source_sha256")
    if source is not None and source != manifest.onnx_sha256:
        return f"{entry.file} was made for another {manifest.onnx_file} than the export's now"
    if entry.sha256 != graph_sha256(path):
        return f"{entry.file} is not the graph its entry records (sha256 differs)"
    external_locations(path)  # ManifestError (one line) where the weights it reads lie outside the export
    for name, rec in (entry.external_data or {}).items():
        data = member(Path(export_dir), name, f"variant {kind!r} external data")
        if not data.is_file() or not isinstance(rec, Mapping) or graph_sha256(data) != rec.get("sha256"):
            return f"{name}, the weights of {entry.file}, is not what its entry records (sha256 differs)"
    return None


def attention_problem(export_dir: Path, manifest, expected_outputs: list[str] | None = None) -> str | None:
    """Why the export's attention graph (its ``attn`` entry in manifest.json) cannot be used as it is, or None:
    ``variant_problem``'s checks, and its outputs those its entry records (and ``expected_outputs``, where the
    caller knows them: every layer's pattern and the summaries)."""
    why = variant_problem(export_dir, manifest, "attn")
    if why is not None:
        return why
    entry = manifest.variant("attn")
    claimed = (entry.raw.get("details") or {}).get("outputs")
    path = Path(export_dir) / entry.file
    if graph_facts(path)[0] != claimed or (expected_outputs is not None and claimed != list(expected_outputs)):
        return f"{entry.file}'s outputs are not those its entry records"
    return None


def head_graph_problem(export_dir: Path, manifest, file: str, *, sha256: str, content_sha256: str | None,
                       model_onnx_sha256: str, said_by: str) -> str | None:
    """Why a graph that reads the export's stored head (``file``) cannot be used as the record ``said_by`` says,
    or None: missing or not a regular file, made for another ``model.onnx``, the graph (``sha256``) or the
    weights it reads (``content_sha256``: the stored head it shares, its own data file) not as recorded."""
    from layerscope.jsonfile import NotRegularFile, check_regular

    path = Path(export_dir) / file
    try:
        check_regular(path)
    except FileNotFoundError:
        return f"{file} is missing"
    except NotRegularFile as exc:
        return str(exc)
    if model_onnx_sha256 != manifest.onnx_sha256:
        return f"{file} was made for another {manifest.onnx_file}"
    if graph_sha256(path) != sha256:
        return f"{file} is not the graph {said_by} records (sha256 differs): damaged or replaced"
    if content_sha256 is None:
        return f"{said_by} records no hash of the weights {file} reads (an earlier layerscope's)"
    if source_sha256(path) != content_sha256:
        return f"the weights {file} reads are not those {said_by} records"
    return None


def lens_problem(export_dir: Path, manifest, sidecar) -> str | None:
    """Why a lens graph (``sidecar``: model/lens_record.py ``LensSidecar``) cannot be used as it is, or None: the
    checks of ``head_graph_problem``, and its outputs those the sidecar records."""
    why = head_graph_problem(export_dir, manifest, sidecar.file, sha256=sidecar.sha256,
                             content_sha256=sidecar.content_sha256, model_onnx_sha256=sidecar.model_onnx_sha256,
                             said_by="its sidecar")
    if why is None and tuple(graph_facts(Path(export_dir) / sidecar.file)[0]) != tuple(sidecar.outputs):
        return f"{sidecar.file}'s outputs are not those its sidecar records"
    return why


def head_problem(export_dir: Path, manifest, record=None) -> str | None:
    """Why the export's head logits graph (``head-logits.onnx``: model/head_record.py) cannot be used as its record
    says, or None (``head_graph_problem``'s checks). ``record``: already read (``load_head_record``)."""
    from layerscope.model.head_record import RECORD_FILE, load_head_record

    if record is None:
        record = load_head_record(export_dir)
    if record is None:
        return f"{RECORD_FILE} is not a record this version writes (damaged or older); its graph is made again"
    return head_graph_problem(export_dir, manifest, record.file, sha256=record.sha256,
                              content_sha256=record.content_sha256, model_onnx_sha256=record.model_onnx_sha256,
                              said_by=RECORD_FILE)


# ---------------------------------------------------------------- layerscope verify

def derived_records(export_dir: Path) -> list[Path]:
    """Every record of a graph derived from an export's graph, beside it (early exit's and pooled-only graphs',
    the graph in blocks', the graphs resuming at a layer)."""
    export_dir = Path(export_dir)
    return sorted({*export_dir.glob("*.upto-*.json"), *export_dir.glob("*.blocked.json"),
                   *export_dir.glob("*.from-*.json")})


def _record_problem(record: Path, manifest) -> str | None:
    from layerscope.jsonfile import NotRegularFile, check_regular

    try:
        check_regular(record)
    except NotRegularFile as exc:
        return str(exc)
    data = _load_record(record)
    if not isinstance(data, dict):
        return f"{record.name} is not a record (damaged, or a JSON {type(data).__name__}); its graph is made again"
    graph = record.with_suffix(".onnx")
    source_name = data.get("source")
    if not plain_name(source_name):
        return f"{record.name} names its source {source_name!r}, not a file beside it"
    source = record.parent / source_name
    if not graph.is_file() or not source.is_file():
        return f"{record.name}: {graph.name if not graph.is_file() else source_name} is missing"
    if data.get("sha256") != graph_sha256(graph):
        return f"{graph.name} is not the graph {record.name} records (sha256 differs): damaged or replaced"
    if data.get("source_sha256") != source_sha256(source):
        return f"{graph.name} was made from an earlier {source_name}; it is made again on its next use"
    outputs, layers, nodes, ops = graph_facts(graph)
    if data.get("outputs") is not None and data.get("outputs") != outputs:
        return f"{record.name} records outputs that are not {graph.name}'s"
    if any(o.startswith("pooled.") for o in outputs):
        claimed = data.get("pooled_layers", list(manifest.pooled_layers))
        if claimed != layers:
            return f"{record.name} says the pooled rows are layers {claimed}, {graph.name} stacks {layers}"
    if data.get("nodes") is not None and data.get("nodes") != nodes:
        return f"{record.name} records {data.get('nodes')} nodes, {graph.name} has {nodes}"
    weights = data_problem(record, data)
    if weights is not None:
        return weights
    if data.get("layers") is not None and data.get("layers") != ops.get("Loop", 0):
        return f"{record.name} records {data.get('layers')} layers in blocks, {graph.name} has {ops.get('Loop', 0)}"
    return None


_UNCHECKED = object()  # a derived file ``verify_derived`` neither passes nor faults (an older format: made again)


def verify_derived(export_dir: Path, manifest) -> tuple[int, list[str]]:
    """(derived graphs that hold, one line per problem) over every derived graph of an export and its record:
    the rule's checks (this module's docstring), as ``layerscope verify`` runs them."""
    from layerscope.model.lens_record import LensSidecar

    export_dir = Path(export_dir)
    checks: list[tuple[str, Any]] = [("", lambda r=record: _record_problem(r, manifest))
                                     for record in derived_records(export_dir)]

    def lens(sidecar: Path) -> object:
        meta = LensSidecar.from_disk(sidecar)  # None: a sidecar of another format, made again on use
        return _UNCHECKED if meta is None else lens_problem(export_dir, manifest, meta)

    checks += [(f"{sidecar.name}: ", lambda s=sidecar: lens(s)) for sidecar in sorted(export_dir.glob("lens-k*.json"))]
    if (export_dir / "head-logits.json").exists():
        checks.append(("head-logits.json: ", lambda: head_problem(export_dir, manifest)))
    checks += [(f"variant '{kind}': ", lambda k=kind: attention_problem(export_dir, manifest) if k == "attn"
                else variant_problem(export_dir, manifest, k)) for kind in manifest.variants]
    checked, problems = 0, []
    for label, check in checks:
        try:
            why = check()
        except ManifestError as exc:
            why = str(exc)
        if why is _UNCHECKED:
            continue
        if why:
            problems.append(label + why)
        else:
            checked += 1
    return checked, problems
