"""The Optimum ``OnnxConfig`` of a family, extended to output every hidden state (the exporter's half).

Its inputs are the ones the families table lists (model/families.py ``Family.inputs``);
tests/test_families_table.py holds the two equal.
"""

from __future__ import annotations

from typing import Any

from layerscope.model.families import Family


def onnx_config_class(family: Family):
    """The optimum OnnxConfig class of the family, extended to output every hidden state."""
    from optimum.exporters.onnx import model_configs as mc

    if family.name == "t5-encoder":
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

        base = T5EncoderConfig
    else:
        base = getattr(mc, family.onnx_config)

    class AllLayersConfig(base):
        """The family's optimum config whose outputs are every hidden state (plus its pooled output)."""

        @property
        def inputs(self):
            # Pooling needs the padding mask; some configs (CLIP text) leave it out.
            out = dict(super().inputs)
            if "attention_mask" not in out:
                out["attention_mask"] = {0: "batch_size", 1: "sequence_length"}
            return out

        @property
        def outputs(self):
            # Names are matched to the model's outputs by position, and Hugging Face returns the
            # pooled output before the hidden states.
            num_layers = self._layerscope_num_layers
            out = {family.pooled_output: {0: "batch_size"}} if family.pooled_output else {}
            out.update({f"hidden_states.{i}": {0: "batch_size", 1: "sequence_length"}
                        for i in range(num_layers + 1)})
            return out

    AllLayersConfig.__name__ = f"LayerscopeAllLayers{base.__name__}"
    return AllLayersConfig


def make_onnx_config(config, family: Family, num_layers: int):
    cls = onnx_config_class(family)
    kwargs: dict[str, Any] = {"task": "feature-extraction"}
    if family.kind == "decoder":
        kwargs["use_past"] = False
        kwargs["use_past_in_inputs"] = False
    onnx_cfg = cls(family.text_model_config(config), **kwargs)
    onnx_cfg._layerscope_num_layers = num_layers
    return onnx_cfg
