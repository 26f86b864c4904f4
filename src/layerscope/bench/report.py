"""Bench results on disk: ``bench.json``, ``bench.md`` (the table) and ``bench.png`` (bar plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _f(value, fmt: str, none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def worst_accuracy(result: dict[str, Any]) -> tuple[float | None, float | None, str | None]:
    """(max |diff| over layers, min cosine over layers, the layer with the min cosine)."""
    acc = result.get("accuracy") or {}
    if not acc:
        return None, None, None
    abs_vals = [a["max_abs"] for a in acc.values() if a.get("max_abs") is not None]
    layer = min(acc, key=lambda k: acc[k]["min_cos"])
    return (max(abs_vals) if abs_vals else None), acc[layer]["min_cos"], layer


def _load(r: dict[str, Any]) -> str:
    vals = [v for v in (r.get("load_avg_1m") or []) if v is not None]
    return "-" if not vals else "/".join(f"{v:.1f}" for v in vals)


def markdown_table(bench: dict[str, Any]) -> str:
    s = bench["settings"]
    m = bench["machine"]
    final = s["layers"][-1]
    lines = [
        f"Model `{bench['model']['source']}` ({bench['model']['family']}, {bench['model']['num_layers']} layers), "
        f"corpus {bench['corpus']['name']} ({bench['corpus']['texts']:,} texts, "
        f"{_f(bench['corpus']['tokens_unpadded'], ',')} tokens), layers {s['layers'][0]}..{final}, "
        f"pooling {s['pooling']}; {m['cpu_model']}, {m['usable_cores']} cores, GPU: {m['gpu']}.",
        "",
        "| engine | texts/s | tokens/s | p50 ms | p95 ms | peak RSS MiB | setup s | x hf-eager | x sent-tr "
        "| texts/CPU-s | x hf-eager (CPU) | load 1m | worst max abs | worst min cos (layer) | STS final "
        "| STS worst drop (layer) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in bench["results"]:
        if not r.get("available"):
            continue
        max_abs, min_cos, layer = worst_accuracy(r)
        sts = r.get("sts_spearman") or {}
        delta = r.get("sts_spearman_delta") or {}
        worst_drop = min(delta.items(), key=lambda kv: kv[1]) if delta else None
        label = r["engine"] + (" (**final layer only**)" if r["engine"] == "sentence-transformers" else "")
        lines.append(
            f"| {label} | {r['texts_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | "
            f"{_f(r.get('latency_p50_ms'), '.1f')} | {_f(r.get('latency_p95_ms'), '.1f')} | "
            f"{r['peak_rss_mib']:,.0f} | {r['setup_s']:.2f} | {_f(r.get('speedup_vs_hf_eager'), '.2f')} | "
            f"{_f(r.get('speedup_vs_sentence_transformers'), '.2f')} | {_f(r.get('texts_per_cpu_s'), ',.1f')} | "
            f"{_f(r.get('cpu_speedup_vs_hf_eager'), '.2f')} | {_load(r)} | {_f(max_abs, '.2e')} | "
            f"{_f(min_cos, '.6f')}{f' ({layer})' if layer else ''} | {_f(sts.get(final), '.2f')} | "
            + (f"{worst_drop[1]:+.2f} ({worst_drop[0]})" if worst_drop else "-") + " |")
    missing = [r for r in bench["results"] if not r.get("available")]
    if missing:
        lines += ["", "Not run here:", ""]
        lines += [f"- `{r['engine']}`: {r['reason']}" for r in missing]
    return "\n".join(lines) + "\n"


def write_results(bench: dict[str, Any], out_dir: str | Path, *, plot: bool = True) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "markdown": out / "bench.md"}
    paths["json"].write_text(json.dumps(bench, indent=2) + "\n", encoding="utf-8")
    command = bench.get("command")
    md = f"# layerscope bench\n\n{'Command: `' + command + '`' + chr(10) + chr(10) if command else ''}"
    if bench.get("kind") == "layerscope-bench-isolated":
        from layerscope.bench.isolated_report import isolated_table

        paths["markdown"].write_text(md + isolated_table(bench), encoding="utf-8")
    else:
        paths["markdown"].write_text(md + markdown_table(bench), encoding="utf-8")
    if plot:
        paths["plot"] = out / "bench.png"
        bar_plot(bench, paths["plot"])
    return paths


FINAL_ONLY = "\n(final layer only)"
ACCURACY_BAR = 0.999  # min cosine to the fp32 reference below which a row is not the same accuracy class


def row_min_cos(row: dict[str, Any]) -> float | None:
    """A row's worst cosine to the fp32 reference over its layers (None where it was not measured)."""
    if row.get("min_cos") is not None:
        return float(row["min_cos"])
    return worst_accuracy(row)[1]


def below_accuracy(row: dict[str, Any]) -> bool:
    min_cos = row_min_cos(row)
    return min_cos is not None and min_cos < ACCURACY_BAR


def bar_labels(bench: dict[str, Any]) -> list[str]:
    """One label per available row; rows that produce only the final layer (peers) say so."""
    from layerscope.bench.isolated_report import final_only

    layers = bench["settings"]["layers"]
    return [r["engine"] + (FINAL_ONLY if final_only(r, layers) or r["engine"] == "sentence-transformers" else "")
            for r in bench["results"] if r.get("available")]


def bar_plot(bench: dict[str, Any], path: Path) -> None:
    """Throughput bars, written as PNG at ``path`` and SVG beside it; the title wraps to stay inside."""
    from layerscope.report.plots import _plt, fit_title, save

    plt = _plt()
    rows = [r for r in bench["results"] if r.get("available")]
    names = bar_labels(bench)
    speeds = [r["texts_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4), dpi=110)
    colors = ["#999999" if r["kind"] == "baseline" else "#3b6ea5" for r in rows]
    bars = ax.bar(names, speeds, color=colors)
    for bar, name in zip(bars, names):
        if name.endswith(FINAL_ONLY):  # peers: hatched, and said in the label and the legend
            bar.set_hatch("//")
            bar.set_facecolor("#d9a441")
    below = [below_accuracy(r) for r in rows]
    for bar, low in zip(bars, below):  # less accurate than the class: a red edge, its min cos in the label
        if low:
            bar.set_edgecolor("#c0392b")
            bar.set_linewidth(2.0)
            bar.set_linestyle("--")
            bar.set_gid("below-accuracy")
    from matplotlib.patches import Patch

    handles = []
    if any(n.endswith(FINAL_ONLY) for n in names):
        handles += [Patch(facecolor="#3b6ea5", label=f"all {len(bench['settings']['layers'])} layers"),
                    Patch(facecolor="#d9a441", hatch="//", label="final layer only (peers)")]
    if any(below):
        handles.append(Patch(facecolor="white", edgecolor="#c0392b", linewidth=2.0, linestyle="--",
                             label=f"min cos to fp32 < {ACCURACY_BAR:g}"))
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for bar, r, low in zip(bars, rows, below):
        x = r.get("speedup_vs_hf_eager", r.get("x_hf_eager"))
        ax.annotate(f"{r['texts_per_s']:,.0f}" + (f"\n{x:.1f}x" if x else "")
                    + (f"\nmin cos {row_min_cos(r):.4f}" if low else ""),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8,
                    color="#c0392b" if low else "black")
    ax.set_ylabel("texts / s")
    ax.tick_params(axis="x", rotation=30)
    ax.margins(y=0.2)
    fit_title(fig, ax, f"{bench['model']['source']}: {bench['corpus']['texts']:,} texts, "
                       f"{len(bench['settings']['layers'])} layers {bench['settings']['pooling']}-pooled")
    where = machine_line(bench)
    if where:  # the figure carries the machine it was measured on, as the tables do
        import textwrap

        fig.text(0.01, 0.0, textwrap.fill(where, max(60, int(fig.get_figwidth() * 15))), fontsize=7,
                 color="#444444", ha="left", va="top", gid="machine")
    save(plt, fig, Path(path))


def machine_line(bench: dict[str, Any]) -> str:
    """The machine a bench ran on, in one line, as its table says it: CPU, the cores it used, its vector flags,
    the GPU, and the load average (1 min) range: at each row process's start where the bench recorded those
    (each row in its own process), else before and after each row (empty for a bench that recorded no machine)."""
    m = bench.get("machine") or {}
    if not m:
        return ""
    parts = [f"{m.get('cpu_model', 'CPU')}, {m.get('usable_cores', '?')} cores"]
    if m.get("cpu_flags"):
        parts.append(" ".join(m["cpu_flags"]))
    parts.append(f"GPU: {m.get('gpu') or 'none'}")
    at_starts = "load_avg_1m_at_starts" in m
    loads = [v for v in m["load_avg_1m_at_starts"] if v is not None] if at_starts else \
        [v for r in bench.get("results", []) for v in (r.get("load_avg_1m") or []) if v is not None]
    if loads:
        parts.append(f"load (1 min) {'at row starts' if at_starts else 'around the rows'} "
                     f"{min(loads):.1f}-{max(loads):.1f}")
    return "; ".join(parts)
