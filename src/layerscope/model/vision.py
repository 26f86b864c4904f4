"""Vision towers: loading one (alone, or from a two-tower CLIP/SigLIP checkpoint), running it with every
hidden state, and turning images into the ``pixel_values`` it reads with the checkpoint's own image processor.

``load_vision_tower`` returns a ``VisionTower``: a torch module whose forward takes ``pixel_values`` and
returns ``(hidden_states, image_embeds)``, the second being the joint image-text embedding (CLIP's
``visual_projection`` of its pooled CLS, SigLIP's attention-pooling head) or None where the checkpoint has
none.  The exporter traces it, the torch engine runs it, and the export's parity check compares the two.

Images of another size than the checkpoint's (``export --image-size``): the tower is run with its position
embeddings resized to the patch grid (transformers' own ``interpolate_pos_encoding``, which DINOv2 always
applies), and the export's image processor is set to give that size (``processor_at_size``).
torch and transformers are imported inside the functions (the model floor imports light).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from layerscope.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from layerscope.model.families import Family
    from layerscope.model.source import ModelSource

PROCESSOR_FILE = "preprocessor_config.json"


def _tower_class():
    import torch

    class VisionTower(torch.nn.Module):
        """The vision transformer of a checkpoint and its way into the joint space, as one module."""

        def __init__(self, model, family: Family):
            super().__init__()
            self.tower = _recording_tower(model)
            self.projection = getattr(model, "visual_projection", None) if family.joint_embedding == "projection" else None
            self.joint = family.joint_embedding if (family.joint_embedding == "pooler"
                                                    and _has_head(self.tower)) else None
            if self.projection is not None:
                self.joint = "projection"

        def forward(self, pixel_values):
            out = self.tower(pixel_values=pixel_values, output_hidden_states=True,
                             **resize_positions(self.tower, pixel_values))
            embeds = None
            if self.joint == "projection":
                embeds = self.projection(out.pooler_output)
            elif self.joint == "pooler":
                embeds = out.pooler_output
            return tuple(out.hidden_states), embeds

    return VisionTower


def resize_positions(tower, pixel_values) -> dict[str, bool]:
    """``interpolate_pos_encoding=True`` where ``tower`` takes the flag and ``pixel_values`` are not the
    checkpoint's own size (ViT, CLIP and SigLIP refuse other sizes without it; DINOv2 always resizes)."""
    import inspect

    if "interpolate_pos_encoding" not in inspect.signature(tower.forward).parameters:
        return {}
    size = tower.config.image_size
    native = (size, size) if isinstance(size, int) else tuple(size)
    return {"interpolate_pos_encoding": True} if tuple(pixel_values.shape[-2:]) != tuple(native) else {}


def serves_other_sizes(tower) -> bool:
    """Whether ``tower`` resizes its position embeddings to another image size (transformers'
    ``interpolate_pos_encoding`` on its embeddings module)."""
    return any(callable(getattr(type(m), "interpolate_pos_encoding", None)) for m in tower.modules())


def _has_head(tower) -> bool:
    inner = getattr(tower, "vision_model", tower)
    return bool(getattr(inner, "use_head", False)) and getattr(inner, "head", None) is not None


def _recording_tower(model):
    """The module whose forward hands back every hidden state: CLIP's vision transformer, or (SigLIP) a
    ``SiglipVisionModel`` around the two-tower model's transformer (SigLIP records its hidden states in the
    vision model's forward, which the two-tower model does not call)."""
    import torch
    import transformers

    if isinstance(model, transformers.SiglipModel):
        with torch.device("meta"):  # the shell's own weights are never used: no memory, no init
            shell = transformers.SiglipVisionModel(model.config.vision_config)
        shell.vision_model = model.vision_model
        return shell.eval()
    if isinstance(model, transformers.SiglipVisionModel):
        return model
    return getattr(model, "vision_model", model)  # CLIP keeps the transformer inside


def load_vision_tower(source: ModelSource, family: Family, *, trust_remote_code: bool = False, config=None):
    """The ``VisionTower`` of ``source`` in fp32, eval mode, eager attention (``config``: as already read)."""
    from dataclasses import replace

    from layerscope.model.source import load_config, load_torch_model

    config = config if config is not None else load_config(source, trust_remote_code=trust_remote_code)
    loader = "AutoModel"
    if "CLIPVisionModelWithProjection" in (getattr(config, "architectures", None) or []):
        loader = "CLIPVisionModelWithProjection"  # AutoModel would drop its projection
    model = load_torch_model(source, replace(family, loader=loader), trust_remote_code=trust_remote_code)
    return _tower_class()(model, family).eval()


@dataclass
class ImageBatch:
    """Images as a vision tower reads them: ``inputs["pixel_values"]`` float32 ``[batch, 3, H, W]``."""

    inputs: dict[str, Any]
    index: Any  # row positions of these images in the corpus
    prefix_tokens: int  # CLS and register tokens before the patches (left out of ``mean``)

    @property
    def size(self) -> int:
        return int(self.inputs["pixel_values"].shape[0])

    @property
    def input_ids(self):
        return None

    @property
    def mask(self):
        raise InputError("an image batch has no attention mask: pool image tokens with vocab/image_pooling.py")


class ImageEncoder:
    """Images (PIL) into an ``ImageBatch`` through the export's own image processor, held to the size the
    graph was traced at (``manifest.image``)."""

    def __init__(self, folder, manifest, *, trust_remote_code: bool = False):
        if manifest.image is None:
            raise InputError(f"{manifest.source.label} reads text, not images")
        self.image = manifest.image
        from layerscope.data.images import ImageBound

        self.processor = load_image_processor(folder, trust_remote_code=trust_remote_code)
        self.bound = ImageBound.of(self.processor)  # what an image may be to pass through it (data/images.py decode)
        self.where = str(folder)

    def pixels(self, images) -> np.ndarray:
        return self.checked(pixel_values(self.processor, images))

    def checked(self, pixels: np.ndarray) -> np.ndarray:
        """``pixels`` (made elsewhere with this processor, e.g. on a worker) if the graph takes their size."""
        check_image_size(pixels, (self.image.height, self.image.width), self.where)
        return pixels

    def batch(self, pixels: np.ndarray, index=None) -> ImageBatch:
        import numpy as np

        idx = np.arange(len(pixels)) if index is None else np.asarray(index)
        return ImageBatch({"pixel_values": pixels}, idx, self.image.prefix_tokens)

    def __call__(self, images, index=None) -> ImageBatch:
        return self.batch(self.pixels(images), index)


def load_image_processor(folder, *, trust_remote_code: bool = False):
    """The image processor saved with a checkpoint or an export (``preprocessor_config.json``), or one line."""
    from pathlib import Path

    if Path(str(folder)).is_dir() and not (Path(str(folder)) / PROCESSOR_FILE).exists():
        raise InputError(f"{folder} has no {PROCESSOR_FILE}: a vision model needs its image processor saved "
                         "beside it (processor.save_pretrained(folder))")
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the image processor of {folder}: {str(exc).splitlines()[0][:200]}") from exc


def pixel_values(processor, images) -> np.ndarray:
    """float32 ``[batch, 3, H, W]`` of PIL images through ``processor`` (RGB first: grey and RGBA photos)."""
    import numpy as np

    rgb = [im.convert("RGB") if getattr(im, "mode", "RGB") != "RGB" else im for im in images]
    out = processor(images=rgb, return_tensors="np")["pixel_values"]
    return np.ascontiguousarray(out, dtype=np.float32)


def parse_image_size(text: str | None) -> tuple[int, int] | None:
    """``--image-size``: ``448`` (square) or ``448x336`` (height x width), or one line."""
    if text is None:
        return None
    parts = str(text).lower().replace(" ", "").split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(f"--image-size '{text}': give pixels as 448 (square) or 448x336 (height x width)")
    height, width = int(parts[0]), int(parts[-1])
    return height, width


def _grid(size: tuple[int, int], patch, where: str) -> tuple[int, int]:
    """The patch grid of an image of ``size``, or one line when the patches do not tile it."""
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    if size[0] % ph or size[1] % pw:
        raise InputError(f"{where}: --image-size {size[0]}x{size[1]} is not a whole number of {ph}x{pw} patches; "
                         f"give multiples of {ph}" + (f" (height) and {pw} (width)" if ph != pw else ""))
    return size[0] // ph, size[1] // pw


def processor_at_size(processor, height: int, width: int, where: str):
    """A copy of ``processor`` that gives ``height`` x ``width`` pixels: a center-cropping processor crops to
    that size after a resize scaled by as much as the crop; a plain resizing one resizes to it.  One line
    where its settings are neither (the pixels it gives would not be one size)."""
    import math

    d = processor.to_dict()
    size, crop = dict(d.get("size") or {}), d.get("crop_size")
    if d.get("do_center_crop") and crop and {"height", "width"} <= set(crop):
        scale = max(height / crop["height"], width / crop["width"])
        if "shortest_edge" in size:
            size = {"shortest_edge": math.ceil(size["shortest_edge"] * scale - 1e-9)}
        elif {"height", "width"} <= set(size):
            size = {"height": math.ceil(size["height"] * scale - 1e-9), "width": math.ceil(size["width"] * scale - 1e-9)}
        else:
            size = None
        if size is not None:
            d.update(size=size, crop_size={"height": height, "width": width})
            return type(processor).from_dict(d)
    elif d.get("do_resize", True) and {"height", "width"} <= set(size):
        d["size"] = {"height": height, "width": width}
        return type(processor).from_dict(d)
    raise InputError(f"{where}: its image processor ({type(processor).__name__}, size {d.get('size')}, crop "
                     f"{d.get('crop_size') if d.get('do_center_crop') else 'none'}) cannot be set to give "
                     f"{height}x{width} pixels; export it at its own size (leave out --image-size)")


def check_image_size(pixels: np.ndarray, expected: tuple[int, int], where: str) -> None:
    """One line when the processor's output is not the size the export was traced at."""
    if tuple(pixels.shape[-2:]) != tuple(expected):
        raise InputError(f"{where}: the image processor gives {pixels.shape[-2]}x{pixels.shape[-1]} pixels but the "
                         f"model was exported at {expected[0]}x{expected[1]}; fix its preprocessor_config.json size")


def describe_vision(source, *, tower: str | None = None, trust_remote_code: bool = False,
                    with_hash: bool = True, image_size: tuple[int, int] | None = None, config=None,
                    family=None) -> dict[str, Any] | None:
    """The manifest's model half of the vision tower of the resolved model ``source`` (``tower="vision"``: a
    two-tower checkpoint's), or None when it is read as text.  ``image_size`` (height, width): the size the
    export reads instead of the checkpoint's (one line when its patches do not tile it).  ``config`` and
    ``family``: as the caller already read and derived them (an export does once)."""
    from pathlib import Path

    import layerscope
    from layerscope.model.families import family_of_config, model_dims, prefix_tokens
    from layerscope.model.source import load_config, weights_hash

    config = config if config is not None else load_config(source, trust_remote_code=trust_remote_code)
    # a type of the model's own code: one line without --trust-remote-code, a text model with it
    family = family if family is not None else family_of_config(config, tower, trust_remote_code)
    if family.modality != "image":
        return None
    vision = family.tower_config(config)
    num_layers, hidden, tokens = model_dims(config, family)
    size = vision.image_size
    native = (size, size) if isinstance(size, int) else tuple(size)
    height, width = native if image_size is None else image_size
    prefix = prefix_tokens(vision, family)
    if image_size is not None:
        rows, cols = _grid((height, width), vision.patch_size, source.spec)
        tokens = rows * cols + prefix
    src = source.to_dict()
    src["weights_sha256"] = weights_hash(source) if with_hash else None
    if with_hash and source.is_local:
        from layerscope.model.identity import local_identity

        src["files_sha256"] = local_identity(Path(source.path_or_id))["files_sha256"]
    src["model_type"] = config.model_type
    from layerscope.model.own_code import own_code
    from layerscope.model.source import _tokenizer_auto_map

    src["own_code"] = own_code(getattr(config, "auto_map", None), _tokenizer_auto_map(source), trust_remote_code)
    return {
        "format_version": None, "layerscope_version": layerscope.__version__, "source": src,
        "family": family.name, "kind": family.kind, "modality": "image", "tower": tower,
        "num_layers": num_layers, "hidden_size": hidden, "max_length": tokens, "max_length_from": "image size",
        "inputs": list(family.inputs or ()), "layers": [str(i) for i in range(num_layers + 1)],
        "final_norm_in_last_layer": False, "final_norm": family.final_norm,
        "default_pooling": family.default_pooling, "eos_token_id": None, "pooled_output": None,
        "embedding_note": "layer 0 is the patch embeddings with position embeddings and the prefix tokens added",
        "image": {"height": int(height), "width": int(width), "patch_size": vision.patch_size,
                  "channels": int(getattr(vision, "num_channels", 3)), "prefix_tokens": prefix,
                  "register_tokens": int(getattr(vision, "num_register_tokens", 0) or 0),
                  "tokens": tokens, "checkpoint_size": [int(native[0]), int(native[1])]},
        "sentence_transformers": None,
    }

