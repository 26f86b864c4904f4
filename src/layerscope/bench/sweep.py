"""``layerscope bench --depths 0,1,3,all``: time per text against the deepest layer asked.

Each depth ``d`` is a whole process-isolated bench (bench/isolated.py) of the engine rows at layers
``0..d``, as an extraction with ``--layers 0:d`` runs them (early exit: engines/truncate.py). Peers are
left out (they compute the final layer only, whatever is asked). The figures per row and depth are the
best texts/s, milliseconds per text, and how many times faster than the same row at every layer. Sweeps
are not recorded for ``auto``: only a bench of every layer ranks engines.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

ALL = "all"


def parse_depths(spec: str, num_layers: int) -> list[int]:
    """``0,1,3,all`` -> deepest layers ``[0, 1, 3, L]`` (sorted, each once; ``all`` and ``-1`` are ``L``)."""
    depths: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == ALL:
            depths.add(num_layers)
            continue
        try:
            d = int(part)
        except ValueError:
            raise InputError(f"--depths takes deepest layers (0..{num_layers}, -1 or all), not {part!r}") from None
        d = num_layers + 1 + d if d < 0 else d
        if not 0 <= d <= num_layers:
            raise InputError(f"--depths {part}: this model's layers are 0..{num_layers}")
        depths.add(d)
    if not depths:
        raise InputError("--depths names no layer; e.g. --depths 0,1,3,all")
    return sorted(depths)


def run_sweep(cfg, depths: str) -> dict[str, Any]:
    """One isolated bench per depth (``cfg``: an ``IsolatedConfig``; its ``layers`` and peers are replaced)."""
    from layerscope.bench.isolated import run_isolated
    from layerscope.export.open import ensure_export

    # the user's flag reaches the export made on first use; the first depth's bench refuses without it, before
    # any row runs, an export whose type only the model's own code defines
    num_layers = ensure_export(cfg.model, trust_remote_code=cfg.trust_remote_code).manifest.num_layers
    runs = []
    for d in parse_depths(depths, num_layers):
        bench = run_isolated(replace(cfg, layers=f"0:{d}", peers=[], sts=None))
        rows = {r["engine"]: float(r["texts_per_s"]) for r in bench["results"]
                if r.get("available") and r.get("kind") == "engine" and r.get("texts_per_s")}
        runs.append({"depth": d, "layers": d + 1, "texts_per_s": rows, "machine": bench["machine"]})
    full = next((r["texts_per_s"] for r in runs if r["depth"] == num_layers), {})
    for r in runs:
        r["ms_per_text"] = {k: round(1000.0 / v, 4) for k, v in r["texts_per_s"].items() if v > 0}
        r["x_faster_than_all"] = {k: round(v / full[k], 3) for k, v in r["texts_per_s"].items() if full.get(k)}
    return {"kind": "layerscope-bench-sweep", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": {"spec": cfg.model, "num_layers": num_layers}, "corpus": {"name": cfg.corpus,
                                                                                "texts": len(cfg.texts)},
            "settings": {"pooling": cfg.pooling, "rounds": cfg.rounds, "passes": cfg.passes,
                         "batch_tokens": cfg.batch_tokens, "threads": cfg.threads},
            "depths": runs}


def sweep_table(sweep: dict[str, Any]) -> str:
    """Markdown: one line per row and depth (ms per text, texts/s, x faster than every layer)."""
    lines = [f"Deepest layer sweep of {sweep['model']['spec']} ({sweep['model']['num_layers']} layers), "
             f"{sweep['corpus']['texts']:,} texts of {sweep['corpus']['name']}", "",
             "| row | deepest layer | layers computed | ms per text | texts/s | x faster than all layers |",
             "|---|---:|---:|---:|---:|---:|"]
    names = sorted({k for r in sweep["depths"] for k in r["texts_per_s"]})
    for name in names:
        for r in sweep["depths"]:
            if name not in r["texts_per_s"]:
                continue
            x = r["x_faster_than_all"].get(name)
            lines.append(f"| {name} | {r['depth']} | {r['layers']} | {r['ms_per_text'][name]:.3f} | "
                         f"{r['texts_per_s'][name]:,.1f} | {'-' if x is None else f'{x:.2f}'} |")
    return "\n".join(lines) + "\n"


def write_sweep(sweep: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "markdown": out / "sweep.md"}
    paths["json"].write_text(json.dumps(sweep, indent=2) + "\n", encoding="utf-8")
    command = sweep.get("command")
    head = f"# layerscope bench --depths\n\n{'Command: `' + command + '`' + chr(10) + chr(10) if command else ''}"
    paths["markdown"].write_text(head + sweep_table(sweep), encoding="utf-8")
    return paths
