"""The Optimum ``OnnxConfig`` of a family, extended to output every hidden state (the exporter's half).

The config class is the one the families table names, else the one Optimum registers for the model type
(``optimum_config_class``; None where Optimum has none: the exporter then takes the plain torch.onnx path,
export/torch_export.py).  Its inputs are the family's (model/families.py ``Family.input_names``), in that
order; tests/test_families_table.py holds Optimum's own declared inputs equal to them where it declares
them, so Optimum's dummy inputs and the graph agree.
"""

from __future__ import annotations

from typing import Any

from layerscope.model.families import Family
from layerscope.vocab.outputs import OWN_LAST, hidden_outputs


def optimum_config_class(family: Family, model_type: str):
    """The Optimum OnnxConfig class for ``model_type`` (one layerscope writes where the table names it, else
    the table's Optimum class, else the registered one), or None."""
    from optimum.exporters.onnx import model_configs as mc

    if family.export_path == "torch":
        return None
    if family.onnx_config in OWN_CONFIGS:
        return OWN_CONFIGS[family.onnx_config]()
    if family.onnx_config:
        return getattr(mc, family.onnx_config, None)
    from optimum.exporters.tasks import TasksManager

    try:
        ctor = TasksManager.get_exporter_config_constructor("onnx", model_type=model_type, task="feature-extraction",
                                                            library_name="transformers")
    except (KeyError, ValueError):
        return None
    return getattr(ctor, "func", ctor)


def export_path(family: Family, config) -> str:
    """"optimum" or "torch": how this checkpoint is traced."""
    cfg = family.text_model_config(config)
    return "optimum" if optimum_config_class(family, cfg.model_type) is not None else "torch"


def _t5_encoder_config():
    """T5's encoder stack alone (Optimum's own T5 config is the encoder-decoder's)."""
    from optimum.exporters.onnx.config import TextEncoderOnnxConfig
    from optimum.utils import NormalizedTextConfig

    class T5EncoderConfig(TextEncoderOnnxConfig):
        NORMALIZED_CONFIG_CLASS = NormalizedTextConfig.with_args(
            hidden_size="d_model", num_attention_heads="num_heads", num_layers="num_layers",
            allow_new=True)

        @property
        def inputs(self):
            axes = {0: "batch_size", 1: "sequence_length"}
            return {"input_ids": dict(axes), "attention_mask": dict(axes)}

    return T5EncoderConfig


# the ONNX configs layerscope writes itself, by the name a family's row gives as its ``onnx_config``
OWN_CONFIGS = {"T5Encoder": _t5_encoder_config}


def onnx_config_class(family: Family, model_type: str | None = None):
    """The optimum OnnxConfig class of the family, extended to output every hidden state."""
    base = optimum_config_class(family, model_type or family.model_types[0])
    if base is None:
        raise ValueError(f"Optimum has no ONNX config for {model_type or family.name}")

    class AllLayersConfig(base):
        """The family's optimum config whose outputs are every hidden state (plus its pooled output)."""

        @property
        def inputs(self):
            # the family's inputs in its order (pooling needs the padding mask, which CLIP's config leaves
            # out; Gemma's leaves out position_ids)
            axes = dict(super().inputs)
            return {name: axes.get(name, {0: "batch_size", 1: "sequence_length"})
                    for name in family.input_names(self._config)}

        @property
        def outputs(self):
            # Names are matched to the model's outputs by position, and Hugging Face returns its last hidden
            # state, then the pooled output, then the hidden states.
            num_layers = self._layerscope_num_layers
            out = {OWN_LAST: {0: "batch_size", 1: "sequence_length"}} if self._layerscope_own_last else {}
            out.update({family.pooled_output: {0: "batch_size"}} if family.pooled_output else {})
            out.update({name: {0: "batch_size", 1: "sequence_length"} for name in hidden_outputs(num_layers)})
            return out

    AllLayersConfig.__name__ = f"LayerscopeAllLayers{base.__name__}"
    return AllLayersConfig


def make_onnx_config(config, family: Family, num_layers: int, *, own_last: bool = False):
    """The family's extended config for this checkpoint; ``own_last``: the model's own last hidden state is an
    output too (``OWN_LAST``: where it is not layer L)."""
    text = family.text_model_config(config)
    cls = onnx_config_class(family, text.model_type)
    kwargs: dict[str, Any] = {"task": "feature-extraction"}
    if family.kind == "decoder":
        kwargs["use_past"] = False
        kwargs["use_past_in_inputs"] = False
    onnx_cfg = cls(text, **kwargs)
    onnx_cfg._layerscope_num_layers = num_layers
    onnx_cfg._layerscope_own_last = own_last
    return onnx_cfg


def family_rows(model_types: list[str]) -> list[dict[str, str]]:
    """For ``layerscope families``: each model type's family, kind, export path and the table's notes."""
    from transformers import AutoConfig

    from layerscope.errors import InputError
    from layerscope.model.families import check_config, family_for, family_notes

    rows = []
    for model_type in model_types:
        try:
            family = family_for(model_type)
            config = AutoConfig.for_model(model_type)
            check_config(config, family)  # what a checkpoint of the type would meet (encoder-decoder, ...)
            path = export_path(family, config)
        except (InputError, ValueError, KeyError, TypeError) as exc:  # a config class that needs arguments
            rows.append({"model_type": model_type, "family": "-", "kind": "-", "export": "-",
                         "notes": str(exc).splitlines()[0][:120]})
            continue
        rows.append({"model_type": model_type, "family": family.name, "kind": family.kind, "export": path,
                     "notes": family_notes(family)})
    return rows
