#!/usr/bin/env python
"""Write tests/report/declared_results.json: one small results document per registered analysis, for
tests/report/test_every_declaration.py, which draws every analysis's declared figures from it.

Each analysis runs once on tiny random models (tests/tiny_models.py, tests/tiny_vision.py), offline, and its
results.json is cut down: a table to one row of each kind, shown items to a few, images to a one-pixel PNG. The
documents hold what the analyses' own code writes (field names, nesting), so a declaration that names a field,
table or dotted path the code does not write draws nothing, or "undefined", and the test says which. Run it
again after changing what an analysis writes (a minute or two on two cores):

    python scripts/declared_results.py                 # every analysis
    python scripts/declared_results.py --only sts,lens # refresh some, keep the others
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "report" / "declared_results.json"
ITEMS = 2  # shown items kept (images, maps, pairs, texts; one attention viewer)
SHOWN = {"images": ITEMS, "maps": ITEMS, "pairs": ITEMS, "texts": ITEMS, "viewer": 1}
LABELS = ("layer", "pooling", "group", "value", "kind", "method", "method_a", "method_b", "task", "name",
          "category", "direction", "by")  # the columns that tell a table's rows apart beyond the item
MANIFEST = ("source", "family", "kind", "modality", "tower", "num_layers", "hidden_size", "max_length", "layers",
            "image", "default_pooling", "pooled_output")  # what a report reads of a model's manifest
PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGP4DwABAQEAG7buVgAAAABJRU5ErkJggg==")


def _kind(row: dict) -> tuple:
    """What a row is beside its item: its labels and which fields it has (an undefined layer's row has more)."""
    return tuple(str(row.get(k)) for k in LABELS) + tuple(sorted(row))


def _trim(value, key: str = ""):
    """``value`` cut down: shown items to a few, a table to one row of each kind (every layer, pooling, group
    and method kept, items beyond the first of each dropped), a manifest to what reports read, base64 images to
    one pixel, numbers to four decimals."""
    if isinstance(value, dict):
        if key == "manifest":
            value = {k: v for k, v in value.items() if k in MANIFEST}
        return {k: _trim(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            if key in SHOWN:
                return [_trim(v) for v in value[:SHOWN[key]]]
            kinds = {}
            for row in value:
                kinds.setdefault(_kind(row), row)
            return [_trim(v) for v in kinds.values()]
        return [_trim(v) for v in value]
    if key == "thumbnail" and isinstance(value, str):
        return PIXEL
    return round(value, 4) if isinstance(value, float) else value


def _plans(root: Path) -> dict:
    """``{analysis: RunRequest keyword arguments}`` on tiny models made under ``root``; ``analysis+what`` names
    another run of the same analysis, for the parts of its figures only some settings make (a probe, two
    models)."""
    import transformers as t

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import build_tiny_model, first_block_of
    from tiny_vision import build_tiny_vision

    from layerscope.export.attention_variant import make_attention_variant
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    bert = build_tiny_model("bert", root / "bert")
    shallow = first_block_of(bert, root / "bert-1-layer")  # a model of another depth
    attn = root / "bert-attn"
    export_model(resolve_source(str(bert)), attn)
    make_attention_variant(attn)
    clip = build_tiny_model("clip-text", root / "clip")
    t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(clip)
    export_model(resolve_source(str(clip)), root / "clipv", tower="vision")
    dino = build_tiny_vision("dinov2", root / "dino")
    export_model(resolve_source(str(dino)), root / "dinox")
    make_attention_variant(root / "dinox")
    pairs = root / "pairs.tsv"
    words = "the a cat dog man woman child plays runs reads eats in park house guitar book food river".split()
    import numpy as np

    rng = np.random.default_rng(3)
    lines = []
    for i in range(24):
        a = list(rng.choice(words, size=int(rng.integers(3, 8))))
        b = list(rng.choice(words, size=int(rng.integers(3, 8)))) if i % 2 else a[:-1] + ["river"]
        lines.append(f"g\tf\t2020\t{i:04d}\t{round(float(rng.uniform(0, 5)), 1)}\t{' '.join(a)}\t{' '.join(b)}")
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    texts = root / "texts.txt"
    texts.write_text("the cat sat on the mat\nwater boils at sea level\n", encoding="utf-8")
    jsonl = root / "texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": x}) + "\n" for x in ("the cat sat on the mat",
                                                                       "a man plays the guitar")), encoding="utf-8")
    labeled = root / "labeled.jsonl"
    labeled.write_text("".join(json.dumps({"text": x, "label": y}) + "\n" for x, y in (
        ("what a lovely warm day in the park", "pos"), ("the food is great and kind people", "pos"),
        ("what a cold grim day in the park", "neg"), ("the food is awful and rude people", "neg"))), encoding="utf-8")
    tagged = root / "tags.conllu"
    tags = (("the", "DET"), ("quick", "ADJ"), ("fox", "NOUN"), ("jumps", "VERB"), ("a", "DET"), ("lazy", "ADJ"),
            ("dog", "NOUN"), ("sat", "VERB"))
    sentences = [[tags[(i + j) % len(tags)] for j in range(4 + i % 3)] for i in range(20)]
    tagged.write_text("".join("".join(f"{k}\t{w}\t{w}\t{t}\t_\t_\t0\tdep\t_\t_\n" for k, (w, t) in enumerate(s, 1))
                              + "\n" for s in sentences), encoding="utf-8")
    sae_dir, sae_store = _sae(bert, root)
    b = [str(bert)]
    gpt2 = [str(build_tiny_model("gpt2", root / "gpt2"))]
    patch_pairs = root / "patch.jsonl"  # one-character words: the same token count on both sides in a tiny vocabulary
    patch_pairs.write_text("".join(json.dumps({"clean": c, "corrupted": k, "target": "x", "foil": "z"}) + "\n" for c, k in (
        ("a b c d", "a b e d"), ("b c d e", "b a d e"), ("c d e a", "c b e a"))), encoding="utf-8")
    return {
        # cls at raw is the [CLS] row alone, the same for every text: an undefined layer for the listings
        "sts": dict(models=b, data=str(pairs), poolings=["mean", "cls"], options={"n_boot": 20}),
        "sts+probe": dict(models=b, data=str(pairs), poolings=["mean"], layers="-1",
                          options={"n_boot": 0, "probe": True, "train": str(pairs), "dev": str(pairs),
                                   "probe_epochs": 2}),
        "compositionality": dict(models=b, poolings=["mean", "cls"]),
        "pooling": dict(models=b, data=str(pairs), options={"n_boot": 20}),
        "alignment": dict(models=b, options={"generate": "zh-en", "n": 24, "permutations": 10, "examples": 4}),
        "similarity": dict(models=b, options={"n": 15, "knn": 4}),
        "similarity+two": dict(models=[*b, str(shallow)], options={"n": 15, "knn": 4, "permutations": 4,
                                                                   "indices": "svcca,pwcca,procrustes,rsa"}),
        "similarity+indices": dict(models=b, options={"n": 15, "knn": 4, "permutations": 4,
                                                      "indices": "svcca,pwcca,procrustes,rsa"}),
        "geometry": dict(models=b, options={"n": 24, "max_tokens": 200, "gride_n1": 2}),
        "token_probe": dict(models=b, data=str(tagged), layers="0,2"),
        "sae": dict(models=b, layers="1", options={"sae": str(sae_dir), "store": str(sae_store), "features": 4}),
        "lens": dict(models=b, data=str(texts), options={"top_k": 3, "show": 2, "batch": 2}),
        "lens+tuned": dict(models=gpt2, data=str(texts), options={"top_k": 3, "show": 1,
                                                                  "tuned": str(_tuned_lens(gpt2[0], root))}),
        "saliency": dict(models=b, data=str(labeled), layers="1,2",
                         options={"k": 2, "ig_steps": 2, "random_draws": 1, "objective": "similarity",
                                  "reference": "a lovely day in the park", "decode": "logits",
                                  "eval_fraction": 0.5, "gxa": True}),
        "saliency+probe": dict(models=b, data=str(labeled), layers="2",
                               options={"k": 2, "ig_steps": 2, "random_draws": 1, "eval_fraction": 0.5}),
        "patch": dict(models=b, options={"show": 3}),
        "patch+decoder": dict(models=gpt2, data=str(patch_pairs), options={"show": 1, "by": "group"}),
        "steer": dict(models=b, layers="1,2", options={"scales": "1,2"}),
        "steer+decoder": dict(models=gpt2, layers="1,2", options={"scales": "1,2"}),
        "patchscope": dict(models=gpt2, options={"show": 1}),
        "mteb": dict(models=b, data=str(pairs), poolings=["mean"], options={"tasks": "STSBenchmark"}),
        "token_alignment": dict(models=b, options={"generate": "zh-en", "n": 8, "bins": 4}),
        "word_context": dict(models=b, options={"n": 30}),
        "attention": dict(models=[str(attn)], data=str(jsonl), engine="ort", options={"patterns": 2}),
        "explain": dict(models=b, data=str(pairs), options={"max_pairs": 3, "steps": 4, "k": 2, "curve": "2,4",
                                                             "show": 1, "random_draws": 1}),
        "crossmodal": dict(models=[str(root / "clipv"), str(clip)], engine="ort",
                           options={"n": 12, "k": 3, "permutations": 5, "bootstrap": 5}),
        "vision_lens": dict(models=[str(root / "clipv")], engine="ort", options={"n": 8}),
        "cls_attention": dict(models=[str(root / "dinox")], engine="ort", options={"n": 4, "bootstrap": 20}),
    }


def _tuned_lens(model: str, root: Path) -> Path:
    """A tuned lens of ``model`` trained for two steps on a token store of a few texts."""
    from layerscope.decoding.tuned_record import TrainSettings
    from layerscope.decoding.tuned_train import train_lens
    from layerscope.extraction.pipeline import extract

    extract(model, ["the cat sat on the mat", "a dog ran fast", "layers refine the hidden states"],
            root / "lens-store", engine="torch", layers="all", poolings=["mean"], tokens=True)
    train_lens(root / "lens-store", root / "tuned-lens", settings=TrainSettings(steps=2, tokens_per_step=16))
    return root / "tuned-lens"


def _sae(bert: Path, root: Path) -> tuple[Path, Path]:
    """A random SAE in SAELens's folder layout over layer 1 of ``bert``, and a token store holding that layer."""
    import sae_lens
    import torch
    from sae_lens.saes.sae import SAEMetadata

    from layerscope.extraction.pipeline import extract

    store = root / "sae-store"
    extract(str(bert), ["the cat sat on the mat", "a dog ran fast", "layers refine the hidden states"], store,
            engine="torch", layers="1", poolings=["mean"], tokens=True)
    width = json.loads((bert / "config.json").read_text(encoding="utf-8"))["hidden_size"]
    torch.manual_seed(0)
    sae = sae_lens.SAE.from_dict(sae_lens.StandardSAEConfig(
        d_in=width, d_sae=2 * width, metadata=SAEMetadata(hook_name="blocks.0.hook_resid_post")).to_dict())
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    sae.save_model(root / "sae")
    return root / "sae", store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated analyses to run again (default: every one)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="declared-results-") as tmp:
        root = Path(tmp)
        os.environ["LAYERSCOPE_HOME"] = str(root / "home")
        from layerscope.analyses.base import RunRequest, run_analysis
        from layerscope.analyses.registry import registry

        docs = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
        plans = _plans(root)
        only = [name for name in args.only.split(",") if name]
        missing = sorted(set(registry()) - {name.split("+")[0] for name in plans})
        if missing:
            print(f"no plan for {', '.join(missing)}: add one to _plans", file=sys.stderr)
            return 2
        for name, plan in plans.items():
            if only and name not in only:
                continue
            plan = {"engine": "torch", "layers": "all", **plan}
            out, _ = run_analysis(name.split("+")[0], RunRequest(out=root / "runs" / name, cache=False, **plan))
            text = (Path(out) / "results.json").read_text(encoding="utf-8")
            # the same document from every run of this script: the temporary folder's name left out of paths
            doc = json.loads(text.replace(str(root), "/tiny").replace(str(root).replace("/", "-"), "-tiny"))
            docs[name] = _trim({k: doc[k] for k in ("format", "analysis", "description", "main_score", "settings",
                                                    "models", "per_model", "combined") if k in doc})
            print(f"{name}: {len(json.dumps(docs[name])):,} characters", file=sys.stderr)
    lines = [f"{json.dumps(name)}: {json.dumps(doc, ensure_ascii=False, sort_keys=True)}"
             for name, doc in sorted(docs.items())]
    OUT.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")  # one analysis a line
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
