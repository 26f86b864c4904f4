"""Tiny random vision checkpoints built from transformers config classes (no download).

``build_tiny_vision(kind, out_dir, image_size=16, patch_size=4)`` writes ``config.json``,
``model.safetensors`` and the checkpoint's own image processor (``preprocessor_config.json``).
Kinds: ``vit``, ``dinov2`` (with 2 register tokens), ``clip`` (the two-tower ``CLIPModel``),
``clip-vision`` (``CLIPVisionModelWithProjection`` alone), ``siglip`` (two-tower ``SiglipModel``),
``siglip-vision`` (``SiglipVisionModel`` alone).  Hidden size 32, 2 layers, 4 heads.
"""

from __future__ import annotations

from pathlib import Path

import torch

VISION_KINDS = ("vit", "dinov2", "clip", "clip-vision", "siglip", "siglip-vision")
_SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _vision_args(image_size: int, patch_size: int) -> dict:
    return dict(_SHAPE, image_size=image_size, patch_size=patch_size, num_channels=3)


def _text_args() -> dict:
    return dict(_SHAPE, vocab_size=99, max_position_embeddings=16)


def build_tiny_vision(kind: str, out_dir: Path, image_size: int = 16, patch_size: int = 4, seed: int = 0) -> Path:
    import transformers as t

    torch.manual_seed(seed)
    vis = _vision_args(image_size, patch_size)
    size = {"height": image_size, "width": image_size}
    if kind == "vit":
        model = t.ViTModel(t.ViTConfig(**vis), add_pooling_layer=False)
        proc = t.ViTImageProcessor(size=size)
    elif kind == "dinov2":
        model = t.Dinov2WithRegistersModel(t.Dinov2WithRegistersConfig(**vis, num_register_tokens=2))
        proc = t.ViTImageProcessor(size=size, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    elif kind == "clip":
        model = t.CLIPModel(t.CLIPConfig(text_config=_text_args(), vision_config=vis, projection_dim=24))
        proc = t.CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=size)
    elif kind == "clip-vision":
        model = t.CLIPVisionModelWithProjection(t.CLIPVisionConfig(**vis, projection_dim=24))
        proc = t.CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=size)
    elif kind == "siglip":
        model = t.SiglipModel(t.SiglipConfig(text_config=_text_args(), vision_config=vis))
        proc = t.SiglipImageProcessor(size=size)
    elif kind == "siglip-vision":
        model = t.SiglipVisionModel(t.SiglipVisionConfig(**vis))
        proc = t.SiglipImageProcessor(size=size)
    else:
        raise ValueError(kind)
    out_dir = Path(out_dir)
    model.eval().save_pretrained(out_dir, safe_serialization=True)
    proc.save_pretrained(out_dir)
    return out_dir


def hf_vision_reference(kind: str, ckpt: Path, pixel_values, interpolate: bool = False):
    """Plain transformers: (hidden states as numpy, joint image embedding or None) for ``pixel_values``;
    ``interpolate``: pixels of another size than the checkpoint's, read with transformers' own
    ``interpolate_pos_encoding=True`` (DINOv2 takes no flag: it always resizes)."""
    import transformers as t

    cls = {"vit": t.ViTModel, "dinov2": t.Dinov2WithRegistersModel, "clip": t.CLIPModel,
           "clip-vision": t.CLIPVisionModelWithProjection, "siglip": t.SiglipModel,
           "siglip-vision": t.SiglipVisionModel}[kind]
    model = cls.from_pretrained(ckpt, attn_implementation="eager").eval()
    pv = torch.from_numpy(pixel_values)
    flag = {"interpolate_pos_encoding": True} if interpolate and kind != "dinov2" else {}
    with torch.no_grad():
        if kind == "clip":
            hidden = model.vision_model(pixel_values=pv, output_hidden_states=True, **flag).hidden_states
            embeds = model.get_image_features(pixel_values=pv, **flag)
        elif kind == "siglip":  # SiglipModel does not return its vision tower's hidden states
            vision = t.SiglipVisionModel.from_pretrained(ckpt, attn_implementation="eager").eval()
            hidden = vision(pixel_values=pv, output_hidden_states=True, **flag).hidden_states
            embeds = model.get_image_features(pixel_values=pv, **flag)
        else:
            out = model(pixel_values=pv, output_hidden_states=True, **flag)
            hidden = out.hidden_states
            embeds = getattr(out, "image_embeds", None)
            if kind == "siglip-vision":
                embeds = out.pooler_output
    return [h.numpy() for h in hidden], (None if embeds is None else embeds.numpy())
