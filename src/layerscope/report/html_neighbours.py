"""The neighbour browser of report.html: a source text and its nearest targets at every layer.

It shows what alignment saved in results.json (``per_model.<model>.neighbours``: sampled source texts, the
ids and cosines of their nearest targets per pooling and layer, and the texts those ids name). The page's
script builds the browser with ``textContent`` only, so a text from the results file is never markup.
"""

from __future__ import annotations

import html
from typing import Any

from layerscope.report.html_figures import Section

CSS = """
.nb table.t td { vertical-align: top; }
.nb td.hit { background: #d9f2d9; }
.nb .q { font-size: 14px; margin: 6px 0; } .nb .q b { font-weight: 600; }
.nb .scroll { max-height: none; }
"""

SCRIPT = """
window.layerscopeExtras = window.layerscopeExtras || [];
window.layerscopeExtras.push(function (data) {
  var nb = data.neighbours, root = document.getElementById('nb-root');
  if (!nb || !root) { return; }
  var models = Object.keys(nb);
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }
  function select(label, options) {
    var wrap = el('label', label + ' '), s = document.createElement('select');
    options.forEach(function (o) { var opt = el('option', o[1]); opt.value = o[0]; s.appendChild(opt); });
    wrap.appendChild(s); controls.appendChild(wrap); return s;
  }
  var controls = el('div', null, 'nb-controls'); root.appendChild(controls);
  var modelSel = select('model', models.map(function (m) { return [m, m]; }));
  var poolSel = select('pooling', []), querySel = select('source text', []);
  var filter = document.createElement('input'); filter.type = 'search'; filter.placeholder = 'filter source texts';
  controls.appendChild(filter);
  var out = el('div'); root.appendChild(out);
  function fillModel() {
    var m = nb[modelSel.value];
    poolSel.innerHTML = '';
    Object.keys(m.by).forEach(function (p) { var o = el('option', p); o.value = p; poolSel.appendChild(o); });
    if (m.pooling && m.by[m.pooling]) { poolSel.value = m.pooling; }
    fillQueries();
  }
  function fillQueries() {
    var m = nb[modelSel.value], f = filter.value.toLowerCase();
    querySel.innerHTML = '';
    m.queries.forEach(function (q, i) {
      var text = m.sources[String(q)] || '';
      if (f && text.toLowerCase().indexOf(f) < 0) { return; }
      var o = el('option', '#' + q + ': ' + text.slice(0, 90)); o.value = String(i); querySel.appendChild(o);
    });
    draw();
  }
  function draw() {
    var m = nb[modelSel.value], by = m.by[poolSel.value] || {}, i = parseInt(querySel.value, 10);
    out.innerHTML = '';
    if (isNaN(i)) { out.appendChild(el('p', 'No source text matches the filter.', 'note')); return; }
    var q = m.queries[i];
    var head = el('div', null, 'q');
    head.appendChild(el('b', 'source #' + q + ': ')); head.appendChild(el('span', m.sources[String(q)]));
    head.appendChild(el('br'));
    head.appendChild(el('b', 'its partner: ')); head.appendChild(el('span', m.targets[String(q)]));
    out.appendChild(head);
    var table = el('table', null, 't'), tr = el('tr');
    tr.appendChild(el('th', 'layer'));
    for (var r = 1; r <= m.k; r++) { tr.appendChild(el('th', 'neighbour ' + r, 's')); }
    tr.appendChild(el('th', 'partner found at'));
    var thead = el('thead'); thead.appendChild(tr); table.appendChild(thead);
    var body = el('tbody');
    var layers = (m.layers && m.layers.length) ? m.layers : Object.keys(by);
    layers.forEach(function (layer) {
      if (!by[layer]) { return; }
      var row = el('tr'), ids = by[layer].ids[i], scores = by[layer].scores[i], found = '> ' + m.k;
      row.appendChild(el('td', layer));
      ids.forEach(function (j, r) {
        var td = el('td', null, 's' + (j === q ? ' hit' : ''));
        td.appendChild(el('span', j < 0 ? '–' : m.targets[String(j)]));
        td.appendChild(el('div', j < 0 ? '' : 'cos ' + Number(scores[r]).toFixed(3) + ' · #' + j, 'note'));
        row.appendChild(td);
        if (j === q) { found = 'rank ' + (r + 1); }
      });
      var tied = scores.length > 1 && scores.every(function (v) { return v === scores[0]; });
      row.appendChild(el('td', found + (tied ? ' (all ' + m.k + ' tied: order arbitrary)' : '')));
      body.appendChild(row);
    });
    table.appendChild(body);
    var wrap = el('div', null, 'scroll'); wrap.appendChild(table); out.appendChild(wrap);
  }
  modelSel.addEventListener('change', fillModel);
  poolSel.addEventListener('change', draw);
  querySel.addEventListener('change', draw);
  filter.addEventListener('input', fillQueries);
  fillModel();
});
"""


def _valid(nb: Any) -> bool:
    return (isinstance(nb, dict) and isinstance(nb.get("queries"), list) and isinstance(nb.get("by"), dict)
            and isinstance(nb.get("sources"), dict) and isinstance(nb.get("targets"), dict)
            and isinstance(nb.get("k"), int))


def neighbour_section(results):
    """The browser's section of typed ``results``, or None when no model's results hold neighbours (older files)."""
    data = {m: {**f.value("neighbours"), "layers": [str(x) for x in f.value("layers") or []],
                "pooling": f.summary.get("pooling")}
            for m, f in results.per_model.items() if _valid(f.value("neighbours"))}
    if not data:
        return None
    first = next(iter(data.values()))
    intro = (f"For {len(first['queries'])} source texts (a fixed random sample), their {first['k']} nearest target "
             "texts by exact cosine at every layer; the pair's own partner is highlighted in green, and the last "
             "column says at which rank it was found. Pick a model, pooling and source text, or filter by words. "
             f"Direction: {html.escape(str(first.get('direction', 'source -> target')))}.")
    return Section("neighbours", "Neighbour browser", intro=intro, html="<div class='nb' id='nb-root'></div>",
                   css=CSS, script=SCRIPT, data={"neighbours": data})
