"""Running the attention variant on an engine: ONNX Runtime or OpenVINO on ``model.attn.onnx``, or PyTorch
eager on the checkpoint (the same outputs computed by the same function, export/attention.py).

``AttentionRunner(export_dir, engine).run(feed, patterns=...)`` returns one ``AttentionBatch``: the
summaries always, the full patterns only when asked (they are ``B x L x H x T x T`` floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from layerscope.errors import InputError
from layerscope.export import attention as att


def attention_engines() -> tuple[str, ...]:
    """The engines whose registry entry says they run the attention graph."""
    from layerscope.engines.registry import attention_engines as declared

    return declared()


@dataclass(frozen=True)
class AttentionBatch:
    """One batch's attention: ``summaries[name]`` ``[B, L, H]``; ``patterns`` ``[B, L, H, T, T]`` or None."""

    summaries: Mapping[str, np.ndarray]
    patterns: np.ndarray | None = None


def check_attention_engine(engine: str) -> str:
    if engine not in attention_engines():
        from layerscope.errors import unknown_name

        raise unknown_name("engine for attention", engine, attention_engines())
    return engine


def require_attention_variant(handle) -> None:
    """One line saying how to make the attention variant when the export has none."""
    if not handle.is_export or handle.manifest.variant(att.KIND) is None:
        where = handle.export_dir if handle.is_export else "MODEL"
        raise InputError(f"{where} has no attention graph; export it with: layerscope export MODEL --attentions "
                         f"(or add one to an export: layerscope optimize {where} --variant {att.KIND})")


def attention_export(handle, say=None) -> Path:
    """The export dir holding ``handle``'s attention graph. An export the user made must have it already
    (one line says how to add it); a plain model's cached export (made on first use, export/cache.py) gets
    it added on first use too, under the cache entry's lock. A graph whose entry does not hold against it and
    the export's model.onnx (model/derived.py ``attention_problem``) is made again first."""
    if handle.is_export and handle.manifest.variant(att.KIND) is not None:
        from layerscope.model.derived import attention_problem

        why = attention_problem(handle.export_dir, handle.manifest, att.output_names(handle.manifest.num_layers))
        if why is None:
            return handle.export_dir
        from layerscope.export.variants import make_variant

        (say or (lambda msg: None))(f"making the attention graph of {handle.export_dir} again: {why}")
        make_variant(handle.export_dir, att.KIND, force=True, progress=say, trust_remote_code=handle.trust_remote_code)
        return handle.export_dir
    from layerscope.model.home import cache_root

    cache = (cache_root() / "exports").resolve()
    if handle.is_export and cache not in handle.export_dir.resolve().parents:
        require_attention_variant(handle)
    from filelock import FileLock

    from layerscope.export.open import ensure_export
    from layerscope.export.variants import make_variant

    entry = ensure_export(handle).export_dir
    with FileLock(str(entry.parent / f".{entry.name}.lock")):
        (say or (lambda msg: None))(f"adding the attention graph to the cached export {entry}")
        make_variant(entry, att.KIND, progress=say, trust_remote_code=handle.trust_remote_code)
    return entry


class AttentionRunner:
    """The attention outputs of an export with the ``attn`` variant, on ``engine`` (one that declares
    ``attention``: ort, ov or torch), in the runtime its declaration names."""

    def __init__(self, export_dir: str | Path, engine: str = "ort", *, trust_remote_code: bool = False):
        from layerscope.engines.registry import Runtime, engine_spec
        from layerscope.model.manifest import read_manifest

        self.engine = check_attention_engine(engine)
        self.trust_remote_code = bool(trust_remote_code)  # the user's flag: PyTorch runs the model's own code
        runtime = engine_spec(self.engine).runtime
        self.export_dir = Path(export_dir)
        self.manifest = read_manifest(self.export_dir)
        entry = self.manifest.variant(att.KIND)
        if entry is None:
            raise InputError(f"{self.export_dir} has no attention graph; make it with: layerscope optimize "
                             f"{self.export_dir} --variant {att.KIND}")
        from layerscope.model.derived import attention_problem

        why = attention_problem(self.export_dir, self.manifest, att.output_names(self.manifest.num_layers))
        if why is not None:  # the rule of model/derived.py: a record that does not hold is never run
            raise InputError(f"{self.export_dir}: the attention graph cannot be used ({why}); make it again: "
                             f"layerscope optimize {self.export_dir} --variant {att.KIND} --force")
        details = entry.raw.get("details") or {}
        self.special_ids = list(details.get("special_ids") or [])
        self.heads = int(details.get("heads") or 0) or self._config_heads()  # recorded at export
        self.num_layers = self.manifest.num_layers
        self.input_names = list(self.manifest.inputs)
        # the precision the attention is computed in: the engine's own (PyTorch's fp32 eager), else the graph's
        self.precision = engine_spec(self.engine).precision or entry.precision
        if runtime is Runtime.PYTORCH:
            self._module = self._torch_module()
            self._session = None
        else:
            from layerscope.model.manifest_check import member

            path = member(self.export_dir, entry.file, "variant 'attn' file")
            if runtime is Runtime.OPENVINO:
                from layerscope.engines.ov import OvSession

                self._session = OvSession(path)
            else:
                from layerscope.engines.ort import make_session

                self._session = make_session(path, "CPUExecutionProvider")
            self._module = None

    def _config_heads(self) -> int | None:
        from layerscope.export.variants import _num_heads

        return _num_heads(self.export_dir, self.manifest) or None

    def _torch_module(self):
        from layerscope.model.families import family_of
        from layerscope.model.source import load_torch_model

        family = family_of(self.manifest)
        if self.manifest.modality == "image":
            from layerscope.export.vision_attention import vision_attention_net

            net = vision_attention_net(self.manifest)
        else:  # the sinks counted from the export's own tokenizer, not from the entry
            from layerscope.model.handle import ModelHandle

            handle = ModelHandle.resolve(self.export_dir, verify=False, trust_remote_code=self.trust_remote_code)
            self.special_ids = att.special_token_ids(handle.tokenizer())
            net = load_torch_model(self.manifest.source.model_source(), family, attn_implementation="eager",
                                   trust_remote_code=self.trust_remote_code)
        return att.attention_module(net, self.input_names, self.special_ids, decoder=family.kind == "decoder")

    def run(self, feed: Mapping[str, np.ndarray], *, patterns: bool = False) -> AttentionBatch:
        feed = {n: np.ascontiguousarray(feed[n], dtype=np.float32 if n == "pixel_values" else np.int64)
                for n in self.input_names}
        layers = self.num_layers
        names = [att.summary_output(s) for s in att.SUMMARIES]
        if patterns:
            names = [att.pattern_output(i) for i in range(1, layers + 1)] + names
        if self._module is not None:
            import torch

            with torch.no_grad():
                outs = self._module(*[torch.from_numpy(feed[n]) for n in self.input_names])
            by_name = dict(zip(att.output_names(layers), (o.numpy() for o in outs)))
            values = [by_name[n] for n in names]
        else:
            values = self._session.run(names, feed)
        got = dict(zip(names, values))
        stats = {s: np.asarray(got[att.summary_output(s)], dtype=np.float32) for s in att.SUMMARIES}
        full = np.stack([got[att.pattern_output(i)] for i in range(1, layers + 1)], 1) if patterns else None
        return AttentionBatch(summaries=stats, patterns=full)
