"""``run explain``'s figures, from results.json alone: heat maps per pair (PNG and report.html), the
completeness error over steps, the hiding game; report.md. Token text is data: escaped on every page."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def _labels(tokens: list[str]) -> list[str]:
    """Unique axis labels (a repeated token keeps its own row): position and token."""
    return [f"{i}:{t}" for i, t in enumerate(tokens)]


def _scale(matrix: list[list[float]]) -> float:
    return max((abs(v) for row in matrix for v in row), default=0.0) or 1.0


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)[-40:]


def explain_plots(results: dict[str, Any], out_dir: Path) -> list[str]:
    from layerscope.report.plots import bars, heatmap, xy_lines

    files = []
    for model, fig in results["per_model"].items():
        slug = _slug(model)
        for p in fig.get("pairs") or []:
            scale = _scale(p["matrix"])
            files.append(heatmap(out_dir / f"pair{p['pair']}_at_{_slug(str(p['layer']))}_{slug}.png", p["matrix"],
                                 _labels(p["tokens_a"]), _labels(p["tokens_b"]), vmin=-scale, vmax=scale,
                                 title=f"pair {p['pair']} at {p['layer']}, sum {p['matrix_sum']:.3f} ({model})",
                                 xlabel="text b tokens", ylabel="text a tokens", cmap="RdBu_r", rotate=True))
        curves: dict[str, tuple[list, list]] = {}
        for r in fig["tables"]["explain_completeness"]:
            key = f"pair {r['pair']} at {r['layer']}"
            xs, ys = curves.setdefault(key, ([], []))
            xs.append(r["steps"])
            ys.append(r["relative_error"])
        if curves:
            files.append(xy_lines(out_dir / f"completeness_{slug}.png", dict(list(curves.items())[:12]), logx=True,
                                  title=f"completeness error over steps ({model})", xlabel="steps",
                                  ylabel="|matrix sum - target| / |target|"))
        groups, errors = {}, {}
        for r in fig["tables"]["explain_hiding"]:
            groups.setdefault(f"at {r['layer']}", {})[r["method"]] = r["hide_aopc"]
            errors.setdefault(f"at {r['layer']}", {})[r["method"]] = (r.get("hide_aopc_ci_low"),
                                                                     r.get("hide_aopc_ci_high"))
        files.append(bars(out_dir / f"hiding_{slug}.png", groups, errors=errors, ylabel="mean drop of similarity",
                          title=f"hiding game: drop when the top pairs' tokens are deleted ({model})"))
    return files


def explain_markdown(results: dict[str, Any]) -> str:
    from layerscope.report.writer import ci, md_table, sig

    lines = []
    for model, fig in results["per_model"].items():
        s = fig["summary"]
        rel = s.get("completeness_relative_error_max")
        lines += [f"## {model}", "",
                  f"{s['n_pairs']} pair(s) from {s['data']}; {s['similarity']} of {s['pooling']}-pooled embeddings, "
                  f"attributed at {', '.join(map(str, s['at']))} by integrated Jacobians, {s['steps']} steps; "
                  f"baseline: {s['baseline_text']}. Each matrix sums to s(a, b) - [s(r_a, b) + s(a, r_b) - "
                  f"s(r_a, r_b)] (r: the baseline input); largest relative completeness error "
                  f"{'-' if rel is None else f'{100 * rel:.3g}%'}.", "",
                  md_table(fig["tables"]["explain_pairs"]), "",
                  "Hiding game (tokens of the top-k pairs deleted, one side at a time; the controls delete as many "
                  "tokens per side), "
                  f"AOPC = mean drop over k = 1..{s['k_max']}, {s.get('intervals', '95% bootstrap intervals')}:", "",
                  md_table([{"at": r["layer"], "method": r["method"], "AOPC": sig(r["hide_aopc"]),
                             "95% CI": ci(r.get("hide_aopc_ci_low"), r.get("hide_aopc_ci_high")).strip() or "-"}
                            for r in fig["tables"]["explain_hiding"]]), ""]
        tests = [t for t in fig["tables"]["explain_tests"] if t.get("difference") is not None]
        if tests:
            lines += ["Paired tests (paired percentile bootstrap over pairs):", "",
                      md_table([{"at": t["layer"], "A - B": f"{t['method_a']} - {t['method_b']}",
                                 "difference": sig(t["difference"]),
                                 "95% CI": ci(t.get("ci_low"), t.get("ci_high")).strip() or "-",
                                 "p": "-" if t.get("p_value") is None else f"{t['p_value']:.2g}"} for t in tests]), ""]
    return "\n".join(lines)


def _tokens_row(tokens: list[str], scores: list[float], special: list[bool]) -> str:
    scale = max((abs(v) for v, sp in zip(scores, special) if not sp), default=0.0) or 1.0
    cells = []
    for t, v, sp in zip(tokens, scores, special):
        a = min(1.0, abs(v) / scale)
        colour = "transparent" if sp or v == 0 else (f"rgba(230,120,20,{a:.3f})" if v > 0 else
                                                     f"rgba(40,110,220,{a:.3f})")
        cells.append(f'<span class="t{" sp" if sp else ""}" style="background:{colour}" '
                     f'title="{v:.4f}">{html.escape(t)}</span>')
    return "".join(cells)


EXPLAIN_CSS = """
.xpl .t { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px; font-family: monospace; }
.xpl .sp { color: #999; } .xpl p { margin: 4px 0; }
"""


def explain_views(results: dict[str, Any], Section) -> list:
    """report.html's sections (``Section``: html_views' section type, handed in so that neither module imports
    the other)."""
    from layerscope.report.html_figures import bars, heatmap, xy_lines

    charts, rows_html = [], []
    for model, fig in results["per_model"].items():
        groups, errors = {}, {}
        for r in fig["tables"]["explain_hiding"]:
            groups.setdefault(f"at {r['layer']}", {})[r["method"]] = r["hide_aopc"]
            errors.setdefault(f"at {r['layer']}", {})[r["method"]] = (r.get("hide_aopc_ci_low"),
                                                                     r.get("hide_aopc_ci_high"))
        charts.append(bars(groups, errors=errors, ylabel="mean drop of similarity",
                           title=f"Hiding game on pairs ({model})",
                           caption="Mean drop of the similarity when the tokens of the top 1..K token pairs are "
                                   "deleted, one side at a time (pairs), vs as many tokens per side by one-sided "
                                   "sums or at random; "
                                   "whiskers: 95% intervals over pairs."))
        curves: dict[str, tuple[list, list]] = {}
        for r in fig["tables"]["explain_completeness"]:
            xs, ys = curves.setdefault(f"pair {r['pair']} at {r['layer']}", ([], []))
            xs.append(r["steps"])
            ys.append(r["relative_error"])
        if curves:
            charts.append(xy_lines(dict(list(curves.items())[:12]), logx=True, xlabel="steps",
                                   ylabel="relative completeness error", title=f"Completeness error over steps ({model})",
                                   caption="|matrix sum - (similarity - reference terms)| / |similarity - reference "
                                           "terms|, by the number of integration steps."))
        for p in fig.get("pairs") or []:
            scale = _scale(p["matrix"])
            charts.append(heatmap(p["matrix"], _labels(p["tokens_a"]), _labels(p["tokens_b"]), zmin=-scale, zmax=scale,
                                  title=f"Pair {p['pair']} at {p['layer']}: which token pairs make the similarity "
                                        f"({model})", xlabel="text b", ylabel="text a", zlabel="attribution",
                                  caption=f"Similarity {p['similarity']:.4f}; the cells sum to {p['matrix_sum']:.4f} "
                                          f"(target {p['target']:.4f}: the similarity minus the reference terms)."))
            rows_html.append(f"<p><b>pair {p['pair']} at {html.escape(str(p['layer']))}</b></p><p>a: "
                             + _tokens_row(p["tokens_a"], p["rows"], p["special_a"]) + "</p><p>b: "
                             + _tokens_row(p["tokens_b"], p["cols"], p["special_b"]) + "</p>")
    tokens = Section("tokens", "One-sided token attributions", html='<div class="xpl">' + "".join(rows_html) + "</div>",
                     css=EXPLAIN_CSS, intro="Each token coloured by its row (text a) or column (text b) sum of the "
                                            "matrix: orange adds to the similarity, blue takes from it.")
    return [Section("figures", "Token-pair attributions", charts), tokens]
