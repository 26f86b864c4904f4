"""A self-contained HTML page: each text's tokens highlighted by saliency, one row per method.

Colours are scaled per text and per method (the largest |score| gets full colour): orange for
positive scores, blue for negative ones (only the signed baselines have those).  Written from
results.json alone.
"""

from __future__ import annotations

import html
from pathlib import Path

PAGE_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h3 { font-size: 16px; margin-top: 28px; }
"""
# scoped to .sal so that report.html can hold the same fragment next to its own styles
TOKEN_CSS = """
.sal .meta { color: #555; font-size: 13px; margin-bottom: 12px; }
.sal details { border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; margin: 8px 0; }
.sal summary { cursor: pointer; font-size: 14px; }
.sal table { border-collapse: collapse; margin-top: 6px; }
.sal td { padding: 2px 6px; vertical-align: middle; font-size: 13px; }
.sal td.m { color: #444; white-space: nowrap; font-family: monospace; }
.sal span.t { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px; font-family: monospace; }
.sal span.sp { color: #999; }
.sal .legend span { display: inline-block; padding: 2px 8px; margin-right: 6px; border-radius: 3px; }
"""


def _colour(value: float, scale: float) -> str:
    if scale <= 0 or value == 0:
        return "transparent"
    a = min(1.0, abs(value) / scale)
    return f"rgba(230,120,20,{a:.3f})" if value > 0 else f"rgba(40,110,220,{a:.3f})"


def _row(tokens: list[str], scores: list[float], special: list[bool]) -> str:
    scale = max((abs(s) for s, sp in zip(scores, special) if not sp), default=0.0)
    cells = []
    for t, s, sp in zip(tokens, scores, special):
        cls = "t sp" if sp else "t"
        bg = "transparent" if sp else _colour(s, scale)
        cells.append(f'<span class="{cls}" style="background:{bg}" title="{s:.4g}">{html.escape(t)}</span>')
    return "".join(cells)


def saliency_fragment(results) -> str:
    """The highlighted texts of every model of typed ``results`` as an HTML fragment (a ``<div class='sal'>``),
    values escaped."""
    from layerscope.report.templates import fill

    parts = ["<div class='sal'>"]
    for model, fig in results.per_model.items():
        head = (fig.rows("head") or ({},))[0]
        parts.append(f"<h3>{html.escape(model)}</h3>")
        parts.append("<div class='meta'>" + fill(
            "objective: {objective_text}<br>decoding head: {head.kind}: {head.description}<br>tokens hidden with "
            "{replacement_token}; colour scaled per text and method (hover a token for its score)</div>",
            {**fig.summary, "head": head}, html.escape))
        parts.append("<div class='legend'><span style='background:rgba(230,120,20,0.9)'>supports y</span>"
                     "<span style='background:rgba(40,110,220,0.9)'>works against y (signed methods)</span>"
                     "<span class='sp' style='border:1px solid #ccc'>special token, never hidden</span></div>")
        for i, t in enumerate(fig.rows("texts")):
            label = f" | label {html.escape(str(t['label']))}" if t.get("label") is not None else ""
            head = (f"#{i + 1}: {html.escape(t['text'])} <span class='meta'>(y = {t['y']:.4f}{label}"
                    f"{' | explains ' + html.escape(t['target']) if t.get('target') else ''})</span>")
            parts.append(f"<details{' open' if i < 8 else ''}><summary>{head}</summary><table>")
            for method in fig.value("methods") or []:
                if method not in t["scores"]:
                    continue
                parts.append(f"<tr><td class='m'>{html.escape(method)}</td><td>"
                             f"{_row(t['tokens'], t['scores'][method], t['special'])}</td></tr>")
            parts.append("</table></details>")
    parts.append("</div>")
    return "\n".join(parts)


def token_section(results):
    """report.html's section of token highlights (None where no model kept texts)."""
    from layerscope.report.html_figures import Section

    if not any(fig.rows("texts") for fig in results.per_model.values()):
        return None
    return Section("tokens", "Token highlights", html=saliency_fragment(results), css=TOKEN_CSS,
                   intro="Each text's tokens coloured by saliency, one row per method (hover a token for its score).")


def write_saliency_html(path: Path, results) -> str:
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>layerscope saliency</title>",
             f"<style>{PAGE_CSS}{TOKEN_CSS}</style></head><body>", "<h1>layerscope: token saliency</h1>",
             saliency_fragment(results), "</body></html>"]
    from layerscope.report.writer import write_text

    write_text(Path(path), "\n".join(parts))
    return Path(path).name
