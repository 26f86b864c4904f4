"""report.html: one self-contained, interactive page per result directory, made from results.json alone.

The page holds plotly.js once (inlined, so it opens with no network), every figure as JSON in one
``<script type="application/json">`` block, the tables, the run's settings and each model's manifest.
Strings from results.json reach the page only HTML-escaped (markup) or JSON-escaped with ``<``, ``>``
and ``&`` as ``\\u`` escapes (data read by the page's script, which writes them with ``textContent``),
so no value in a results file can close a tag or start a script.
"""

from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger("layerscope")
FILE = "report.html"
MAX_TABLE_ROWS = 1000

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 0; color: #222;
       background: #fafafa; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 60px; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin-top: 34px; border-bottom: 1px solid #ddd;
  padding-bottom: 4px; } h3 { font-size: 15px; margin-top: 22px; }
.sub { color: #555; font-size: 13px; line-height: 1.6; }
nav { font-size: 13px; margin: 10px 0 0; } nav a { margin-right: 14px; color: #1f5fa8; text-decoration: none; }
figure { margin: 18px 0 26px; } figcaption { font-size: 12.5px; color: #555; margin: 2px 4px 0; }
.lsfig { width: 100%; min-height: 360px; }
table.t { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 10px; }
table.t th, table.t td { border-bottom: 1px solid #e6e6e6; padding: 3px 8px; text-align: right; white-space: nowrap; }
table.t th { background: #f3f3f3; position: sticky; top: 0; cursor: pointer; }
table.t td.s, table.t th.s { text-align: left; white-space: normal; max-width: 460px; }
.scroll { max-height: 460px; overflow: auto; border: 1px solid #e6e6e6; display: inline-block; max-width: 100%; }
details { margin: 8px 0; } summary { cursor: pointer; font-size: 14px; }
pre { background: #f6f6f6; padding: 10px; font-size: 12px; overflow: auto; max-height: 420px; }
.note { font-size: 12.5px; color: #555; }
.nb-controls { font-size: 13px; margin: 6px 0 10px; } .nb-controls select, .nb-controls input { font-size: 13px;
  margin-right: 12px; } td.hit { background: #d9f2d9; }
code { background: #f3f3f3; padding: 0 3px; }
"""

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('ls-data').textContent);
  var config = {responsive: true, displaylogo: false,
                toImageButtonOptions: {format: 'svg', filename: 'layerscope-figure'}};
  data.figures.forEach(function (f, i) {
    Plotly.newPlot(document.getElementById('fig-' + i), f.data, f.layout, config);
  });
  document.querySelectorAll('table.t th').forEach(function (th) {
    th.addEventListener('click', function () {
      var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
      var asc = th.getAttribute('data-dir') !== 'asc';
      th.setAttribute('data-dir', asc ? 'asc' : 'desc');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  if (window.layerscopeExtras) { window.layerscopeExtras.forEach(function (fn) { fn(data); }); }
})();
"""


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` (so no ``</script>``), no line separators."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                       ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


def _clean(value: Any) -> Any:
    """NaN and infinities as None (JSON has no NaN); plotly's own encoder output is plain JSON already."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def cell(value: Any, digits: int = 4) -> str:
    """One table cell: numbers formatted (p-values and tiny figures in scientific notation), text escaped."""
    if value is None:
        return "<td data-v=''>–</td>"
    if isinstance(value, bool):
        return f"<td data-v='{int(value)}'>{value}</td>"
    if isinstance(value, int):
        return f"<td data-v='{value}'>{value:,}</td>"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"<td data-v=''>{value}</td>"
        shown = f"{value:.2e}" if value != 0 and abs(value) < 1e-3 else f"{value:.{digits}f}"
        return f"<td data-v='{value!r}'>{shown}</td>"
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False)
    text = html.escape(str(value))
    return f"<td class='s' data-v='{text}'>{text}</td>"


def html_table(rows: list[dict[str, Any]], columns: list[str] | None = None, limit: int = MAX_TABLE_ROWS) -> str:
    if not rows:
        return "<p class='note'>no rows</p>"
    if columns is None:
        columns = []
        for row in rows:
            for k in row:
                if k not in columns:
                    columns.append(k)
    text_cols = {c for c in columns if any(isinstance(r.get(c), str) for r in rows[:50])}
    head = "".join(f"<th class='{'s' if c in text_cols else ''}'>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(r.get(c)) for c in columns) + "</tr>" for r in rows[:limit])
    more = (f"<p class='note'>First {limit:,} of {len(rows):,} rows shown.</p>" if len(rows) > limit else "")
    table = f"<table class='t'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f"<div class='scroll'>{table}</div>{more}"


def _kv_rows(d: dict[str, Any], prefix: str = "", depth: int = 2) -> list[dict[str, Any]]:
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 0 and v:
            rows += _kv_rows(v, key + ".", depth - 1)
        elif isinstance(v, dict) and not v:
            rows.append({"setting": key, "value": "none"})
        elif isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
            rows.append({"setting": key, "value": ", ".join("–" if x is None else str(x) for x in v)})
        else:
            rows.append({"setting": key, "value": v})
    return rows


def _header(results) -> str:
    models = list(results.models or results.per_model)
    title = f"{results.analysis}: {results.description}".strip(": ")
    data, settings = results.settings.data, results.settings
    sha = (results.identity or {}).get("data_sha256")
    facts = [f"models: {', '.join(html.escape(str(m)) for m in models) or '–'}",
             (f"data: <code>{html.escape(data)}</code>" if data else
              f"data: {html.escape(results.data_origin)}" if results.data_origin else
              "data: built in, the analysis default")
             + (f" (sha256 {html.escape(str(sha)[:12])}…)" if sha else ""),
             f"layers: {html.escape(str(settings.layers))}; poolings: "
             f"{html.escape(', '.join(settings.poolings) or 'the analysis default')}",
             f"made by layerscope {html.escape(str(results.layerscope_version))} on "
             f"{html.escape(str(results.created))} in {html.escape(str(results.seconds))} s; "
             "this page is drawn from <code>results.json</code> alone"]
    return (f"<h1>layerscope · {html.escape(title)}</h1><div class='sub'>{'<br>'.join(facts)}</div>")


def _summary(results) -> str:
    """A short table of the headline figures with their 95% intervals (each summary's ``headline``); an
    analysis without one shows its main score and top-level figures. The whole summary stays one click away."""
    from layerscope.report.writer import ci, sig

    main = results.main_score
    models = {str(m): f for m, f in results.per_model.items() if f.summary}
    if not models:
        return ""
    several = len(models) > 1
    rows, notes = [], []
    for model, fig in models.items():
        if fig.headline:
            for h in fig.headline:
                rows.append({**({"model": model} if several else {}), "figure": h.figure, "value": h.value,
                             "95% interval": ci(h.ci_low, h.ci_high).strip() or "–", "where": h.where,
                             "chance": h.chance})
        else:
            scalars = {k: v for k, v in fig.summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for k in sorted(scalars, key=lambda k: k != main):
                rows.append({**({"model": model} if several else {}), "figure": k, "value": scalars[k],
                             "95% interval": "–", "where": "main score" if k == main else "", "chance": None})
        if fig.intervals:
            notes.append((f"{model}: " if several else "") + fig.intervals)
    columns = [c for c in (rows[0] if rows else []) if c in ("figure", "value")
               or any(r.get(c) not in (None, "", "–") for r in rows)]  # no column of dashes alone
    lead = ""
    if main is not None:
        scores = "; ".join(f"{html.escape(m) + ' ' if several else ''}<b>{html.escape(sig(f.summary.get(main), 4))}</b>"
                           for m, f in models.items())
        lead = f"<p>Main score <code>{html.escape(str(main))}</code>: {scores}</p>"
    note = "".join(f"<p class='note'>Intervals: {html.escape(n)}.</p>" for n in notes)
    full = html.escape(json.dumps({m: f.summary for m, f in models.items()}, indent=2, ensure_ascii=False,
                                  default=str))
    return (lead + (html_table(rows, columns) if rows else "") + note
            + f"<details><summary>every summary figure (JSON)</summary><pre>{full}</pre></details>")


def _tables(results) -> str:
    from layerscope.report.writer import merged_tables, safe_file_name

    parts = []
    used: set[str] = set()
    for name, rows in merged_tables(results).items():
        if not rows:
            continue
        csv_name = f"{safe_file_name(name, used)}.csv"
        parts.append(f"<details><summary><b>{html.escape(str(name))}</b> ({len(rows):,} rows; also in "
                     f"<code>{html.escape(csv_name)}</code>; click a column to sort)</summary>{html_table(rows)}"
                     "</details>")
    return "".join(parts) or "<p class='note'>This run wrote no tables.</p>"


def _models(results) -> str:
    parts = []
    for name, record in results.models.items():
        facts = {"model": name, "asked for": record.spec, **record.facts}
        rows = [{"setting": k, "value": v} for k, v in facts.items() if v is not None]
        meta = {"spec": record.spec, "label": record.label, "manifest": record.manifest, "engine": record.engine,
                "export": record.export}
        body = html.escape(json.dumps(meta, indent=2, ensure_ascii=False, default=str))
        parts.append(f"<h3>{html.escape(str(name))}</h3>{html_table(rows, ['setting', 'value'])}"
                     f"<details><summary>full manifest, engine and export record (JSON)</summary><pre>{body}</pre>"
                     "</details>")
    return "".join(parts)


def build_page(results, figures=None) -> str:
    """The whole page as one string, from typed ``results`` (report/results.py; a results document is read
    first) and the analysis's declared ``figures`` (report/figures.py), which draw its charts where given."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    from layerscope.report.html_views import views
    from layerscope.report.results import as_results

    results = as_results(results)

    sections = [s for s in views(results, figures) if s.charts or s.html]
    figures, body = [], []
    for section in sections:
        body.append(f"<h2 id='{section.anchor}'>{html.escape(section.title)}</h2>")
        if section.intro:
            body.append(f"<p class='note'>{section.intro}</p>")
        for chart in section.charts:
            i = len(figures)
            figures.append(chart.figure)
            notes = " ".join(html.escape(n) for n in chart.notes)
            body.append(f"<figure><div class='lsfig' id='fig-{i}' data-kind='{chart.kind}'></div>"
                        f"<figcaption>{html.escape(chart.caption)} {notes}</figcaption></figure>")
        body.append(section.html)
    nav = [(s.anchor, s.title) for s in sections] + [("tables", "Tables"), ("settings", "Settings"),
                                                        ("models", "Models")]
    extras = {k: v for s in sections for k, v in s.data.items()}
    page = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>layerscope {html.escape(results.analysis)} report</title>",
        f"<style>{CSS}{''.join(s.css for s in sections)}</style>",
        f"<script>{get_plotlyjs()}</script></head><body><main>",
        _header(results),
        "<nav>" + "".join(f"<a href='#{a}'>{html.escape(t)}</a>" for a, t in nav) + "</nav>",
        "<h2 id='summary'>Summary</h2>", _summary(results) or "<p class='note'>no summary</p>",
        *body,
        "<h2 id='tables'>Tables</h2>", _tables(results),
        "<h2 id='settings'>Settings</h2>", html_table(_kv_rows(results.settings.raw), ["setting", "value"]),
        "<h2 id='models'>Models</h2>", _models(results),
        f"<p class='note'>Charts drawn with plotly.js {html.escape(get_plotlyjs_version())}, inlined in this file "
        "(no network needed). Hover a point for its value; drag to zoom, double-click to reset; the camera icon "
        "saves a chart as SVG.</p>",
        "</main>",
        f"<script type='application/json' id='ls-data'>{script_json(_clean({'figures': figures, **extras}))}</script>",
        *(f"<script>{s.script}</script>" for s in sections if s.script),
        f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(page)


def write_html_report(out: Path, results, figures=None) -> str | None:
    """Write ``out/report.html``; without plotly installed, say so once and write nothing."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        log.warning("report.html not written: it needs plotly (pip install plotly)")
        return None
    from layerscope.report.writer import write_text

    write_text(Path(out) / FILE, build_page(results, figures))
    return FILE
