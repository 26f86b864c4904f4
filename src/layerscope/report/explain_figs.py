"""``run explain``'s pairs shown in full, typed (``ExplainPair``, checked field by field when results.json is
read), and what the declaration (analyses/explain.py) cannot say: each pair's token x token heat map (PNG and
report.html) and its one-sided token attributions. Token text is data: escaped on every page."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.report.figures import Records
from layerscope.report.results_fields import Bad, as_dict, need


def _number(value: Any, where: str) -> float:
    """A finite number."""
    import math

    need(value, (int, float), where)
    if not math.isfinite(value):
        raise Bad(f"{where} is {value}, not a finite number")
    return float(value)


def _numbers(value: Any, where: str) -> tuple[float, ...]:
    """A list of finite numbers."""
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(need(value, list, where)))


def _side(doc: dict[str, Any], side: str, where: str) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    tokens = need(doc.get(f"tokens_{side}"), list, f"{where}.tokens_{side}")
    special = need(doc.get(f"special_{side}"), list, f"{where}.special_{side}")
    if len(special) != len(tokens):
        raise Bad(f"{where}.special_{side} has {len(special)} entries for {len(tokens)} tokens")
    return (tuple(need(t, str, f"{where}.tokens_{side}[{i}]") for i, t in enumerate(tokens)),
            tuple(need(s, bool, f"{where}.special_{side}[{i}]") for i, s in enumerate(special)))


@dataclass(frozen=True)
class ExplainPair:
    """One pair of texts shown in full at one attribution point: the tokens of each text (which are special),
    the token x token attribution ``matrix`` (rows: text a's tokens, columns: text b's), its row and column
    sums, the similarity, the target the cells sum to and their sum."""

    pair: int
    layer: str
    text_a: str
    text_b: str
    tokens_a: tuple[str, ...]
    tokens_b: tuple[str, ...]
    special_a: tuple[bool, ...]
    special_b: tuple[bool, ...]
    matrix: tuple[tuple[float, ...], ...]
    rows: tuple[float, ...]
    cols: tuple[float, ...]
    similarity: float
    target: float
    matrix_sum: float

    @classmethod
    def read(cls, doc: Any, where: str) -> ExplainPair:
        doc = as_dict(doc, where)
        tokens_a, special_a = _side(doc, "a", where)
        tokens_b, special_b = _side(doc, "b", where)
        matrix = tuple(_numbers(r, f"{where}.matrix[{i}]")
                       for i, r in enumerate(need(doc.get("matrix"), list, f"{where}.matrix")))
        if len(matrix) != len(tokens_a) or any(len(r) != len(tokens_b) for r in matrix):
            raise Bad(f"{where}.matrix is not {len(tokens_a)} x {len(tokens_b)} (text a's tokens x text b's)")
        rows, cols = _numbers(doc.get("rows"), f"{where}.rows"), _numbers(doc.get("cols"), f"{where}.cols")
        if len(rows) != len(tokens_a) or len(cols) != len(tokens_b):
            raise Bad(f"{where}.rows and .cols do not hold one value per token of text a and text b")
        figures = {k: _number(doc.get(k), f"{where}.{k}") for k in ("similarity", "target", "matrix_sum")}
        pair = need(doc.get("pair"), int, f"{where}.pair")
        return cls(pair=pair, layer=str(need(doc.get("layer"), (str, int), f"{where}.layer")),
                   text_a=need(doc.get("text_a"), str, f"{where}.text_a"),
                   text_b=need(doc.get("text_b"), str, f"{where}.text_b"), tokens_a=tokens_a, tokens_b=tokens_b,
                   special_a=special_a, special_b=special_b, matrix=matrix, rows=rows, cols=cols, **figures)

    def to_json(self) -> dict[str, Any]:
        return {"pair": self.pair, "layer": self.layer, "text_a": self.text_a, "text_b": self.text_b,
                "tokens_a": list(self.tokens_a), "tokens_b": list(self.tokens_b),
                "special_a": list(self.special_a), "special_b": list(self.special_b),
                "matrix": [list(r) for r in self.matrix], "rows": list(self.rows), "cols": list(self.cols),
                "similarity": self.similarity, "target": self.target, "matrix_sum": self.matrix_sum}

    @property
    def scale(self) -> float:
        """The colour scale's half range: the largest |cell| (1 where every cell is 0)."""
        return max((abs(v) for row in self.matrix for v in row), default=0.0) or 1.0


PAIRS = Records("pairs", ExplainPair.read)  # what run explain declares (analyses/explain.py)


def _labels(tokens) -> list[str]:
    """Unique axis labels (a repeated token keeps its own row): position and token."""
    return [f"{i}:{t}" for i, t in enumerate(tokens)]


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)[-40:]


def pair_plots(results, out_dir: Path) -> list[str]:
    """A PNG heat map per pair shown, from typed ``results``."""
    from layerscope.report.plots import heatmap

    files = []
    for model, fig in results.per_model.items():
        for p in fig.records(PAIRS):
            files.append(heatmap(Path(out_dir) / f"pair{p.pair}_at_{_slug(p.layer)}_{_slug(model)}.png",
                                 [list(r) for r in p.matrix], _labels(p.tokens_a), _labels(p.tokens_b),
                                 vmin=-p.scale, vmax=p.scale, title=f"pair {p.pair} at {p.layer}, sum "
                                 f"{p.matrix_sum:.3f} ({model})", xlabel="text b tokens", ylabel="text a tokens",
                                 cmap="RdBu_r", rotate=True))
    return files


def _tokens_row(tokens, scores, special) -> str:
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


def pair_section(results):
    """report.html's section of the pairs shown: a heat map each and their one-sided token attributions (None
    where no model kept a pair)."""
    from layerscope.report.html_figures import Section, heatmap

    charts, rows_html = [], []
    for model, fig in results.per_model.items():
        for p in fig.records(PAIRS):
            charts.append(heatmap([list(r) for r in p.matrix], _labels(p.tokens_a), _labels(p.tokens_b),
                                  zmin=-p.scale, zmax=p.scale, xlabel="text b", ylabel="text a", zlabel="attribution",
                                  title=f"Pair {p.pair} at {p.layer}: which token pairs make the similarity ({model})",
                                  caption=f"Similarity {p.similarity:.4f}; the cells sum to {p.matrix_sum:.4f} "
                                          f"(target {p.target:.4f}: the similarity minus the reference terms)."))
            rows_html.append(f"<p><b>pair {p.pair} at {html.escape(p.layer)}</b></p><p>a: "
                             + _tokens_row(p.tokens_a, p.rows, p.special_a) + "</p><p>b: "
                             + _tokens_row(p.tokens_b, p.cols, p.special_b) + "</p>")
    if not charts:
        return None
    return Section("pairs", "Token-pair attributions", charts, html="<h3>One-sided token attributions</h3>"
                   "<p class='note'>Each token coloured by its row (text a) or column (text b) sum of the matrix: "
                   "orange adds to the similarity, blue takes from it.</p><div class='xpl'>" + "".join(rows_html)
                   + "</div>", css=EXPLAIN_CSS)
