"""report.html's attention viewer: pick a model, a text, a layer (or the rollout) and a head (or their mean),
and see the token-to-token pattern as a grid, query tokens down, key tokens across.

The viewer's data (tokens, patterns) travels in the page's JSON block, which ``html_page.script_json``
escapes; the script writes every token with ``textContent`` and builds cells with ``createElement``, so no
text from the data becomes markup. A decoder's masked cells (keys after the query) are drawn as masked
(hatched, no value), not as zero attention. Each text is a typed ``ViewerText``, checked field by field when
results.json is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layerscope.report.figures import Records
from layerscope.report.results_fields import Bad, as_dict, need

CSS = """
.attn-view .nb-controls label { margin-right: 4px; }
.attn-view table.grid { border-collapse: collapse; font-size: 11px; font-family: monospace; margin-top: 8px; }
.attn-view table.grid td { width: 18px; height: 18px; padding: 0; border: 1px solid #f0f0f0; }
.attn-view table.grid td.masked { background: repeating-linear-gradient(45deg, #eee, #eee 3px, #fff 3px, #fff 6px); }
.attn-view table.grid th { font-weight: normal; padding: 0 4px; white-space: pre; color: #333; }
.attn-view table.grid th.col { writing-mode: vertical-rl; transform: rotate(180deg); height: 70px; text-align: left; }
.attn-view table.grid th.sp { color: #a33; }
.attn-view .flow span { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px; font-family: monospace; }
.attn-view .text { font-size: 13px; color: #333; margin: 6px 0; white-space: pre-wrap; }
"""

HTML = """<div class='attn-view' id='attn-view'>
<div class='nb-controls'>
<label for='attn-model'>model</label><select id='attn-model'></select>
<label for='attn-text'>text</label><select id='attn-text'></select>
<label for='attn-layer'>layer</label><select id='attn-layer'></select>
<label for='attn-head'>head</label><select id='attn-head'></select>
</div>
<div class='text' id='attn-text-shown'></div>
<div class='note' id='attn-note'></div>
<div class='scroll'><table class='grid' id='attn-grid'></table></div>
<h3>Attention flow to the input tokens</h3>
<div class='note' id='attn-flow-note'></div>
<div class='flow' id='attn-flow'></div>
</div>"""

SCRIPT = """
(window.layerscopeExtras = window.layerscopeExtras || []).push(function (data) {
  var views = data.attention_viewer || {};
  var models = Object.keys(views);
  if (!models.length) { return; }
  var $ = function (id) { return document.getElementById(id); };
  function fill(select, items) {
    while (select.firstChild) { select.removeChild(select.firstChild); }
    items.forEach(function (it) {
      var o = document.createElement('option'); o.value = it[0]; o.textContent = it[1]; select.appendChild(o);
    });
  }
  function colour(v, top) {
    var a = Math.max(0, Math.min(1, v / (top || 1)));
    return 'rgba(31,95,168,' + a.toFixed(3) + ')';
  }
  function label(tok) { return tok.trim() === '' ? '\u2423' : tok; }  // a whitespace token shown as ␣
  function current() { return views[$('attn-model').value][+$('attn-text').value]; }
  function matrix(t) {
    var layer = $('attn-layer').value, head = $('attn-head').value;
    if (layer === 'rollout') { return t.rollout[t.rollout.length - 1]; }
    var heads = t.patterns[+layer - 1];
    if (head !== 'mean') { return heads[+head]; }
    var n = heads[0].length, out = [];
    for (var i = 0; i < n; i++) { out.push([]); for (var j = 0; j < n; j++) {
      var s = 0; for (var h = 0; h < heads.length; h++) { s += heads[h][i][j]; } out[i].push(s / heads.length); } }
    return out;
  }
  function draw() {
    var t = current(), m = matrix(t), grid = $('attn-grid'), top = 0;
    m.forEach(function (row, i) { row.forEach(function (v, j) { if (!(t.causal && j > i)) { top = Math.max(top, v); } }); });
    $('attn-text-shown').textContent = t.text;
    $('attn-head').disabled = $('attn-layer').value === 'rollout';
    $('attn-note').textContent = (t.causal ? 'Causal attention: a token sees only itself and the tokens before ' +
      'it; hatched cells are masked, not zero. ' : 'Bidirectional attention: every token sees every token. ') +
      'Rows: query tokens; columns: key tokens; colour: attention probability, darkest at the largest value in view (' +
      top.toFixed(3) + '; hover a cell for its value).';
    while (grid.firstChild) { grid.removeChild(grid.firstChild); }
    var head = document.createElement('tr'); head.appendChild(document.createElement('th'));
    t.tokens.forEach(function (tok, j) {
      var th = document.createElement('th'); th.className = 'col' + (t.special[j] ? ' sp' : '');
      th.textContent = label(tok); head.appendChild(th);
    });
    grid.appendChild(head);
    t.tokens.forEach(function (tok, i) {
      var tr = document.createElement('tr'), th = document.createElement('th');
      th.className = t.special[i] ? 'sp' : ''; th.textContent = label(tok); tr.appendChild(th);
      t.tokens.forEach(function (_, j) {
        var td = document.createElement('td');
        if (t.causal && j > i) { td.className = 'masked'; td.title = 'masked'; }
        else { var v = m[i][j]; td.style.background = colour(v, top); td.title = t.tokens[i] + ' \\u2192 ' + t.tokens[j] + ': ' + v.toFixed(4); }
        tr.appendChild(td);
      });
      grid.appendChild(tr);
    });
    var flow = $('attn-flow');
    while (flow.firstChild) { flow.removeChild(flow.firstChild); }
    if (t.flow) {
      $('attn-flow-note').textContent = 'Maximum flow from token ' + t.tokens[t.flow_query] +
        ' at the last layer to each input token (Abnar & Zuidema 2020).';
      var top = Math.max.apply(null, t.flow.concat([1e-9]));
      t.tokens.forEach(function (tok, j) {
        var s = document.createElement('span'); s.textContent = label(tok); s.title = t.flow[j].toFixed(4);
        s.style.background = colour(t.flow[j], top); flow.appendChild(s);
      });
    } else { $('attn-flow-note').textContent = 'No attention flow for this text (too long, or turned off).'; }
  }
  function choose() {
    var t = current(), layers = [], heads = [['mean', 'mean of heads']];
    for (var l = 1; l <= t.patterns.length; l++) { layers.push([String(l), String(l)]); }
    layers.push(['rollout', 'rollout (after the last layer)']);
    for (var h = 0; h < t.patterns[0].length; h++) { heads.push([String(h), String(h)]); }
    fill($('attn-layer'), layers); fill($('attn-head'), heads); draw();
  }
  function texts() {
    fill($('attn-text'), views[$('attn-model').value].map(function (t, i) {
      return [String(i), '#' + (t.index + 1) + ': ' + t.text.slice(0, 60)]; }));
    choose();
  }
  fill($('attn-model'), models.map(function (m) { return [m, m]; }));
  $('attn-model').addEventListener('change', texts);
  $('attn-text').addEventListener('change', choose);
  $('attn-layer').addEventListener('change', draw);
  $('attn-head').addEventListener('change', draw);
  texts();
});
"""


@dataclass(frozen=True)
class ViewerText:
    """One text the viewer shows (``run attention``'s ``viewer``): its tokens, which are special, every layer x
    head pattern [layers][heads][tokens][tokens], the rollout after each layer [layers][tokens][tokens] and the
    attention flow from token ``flow_query`` (None: not computed). ``read`` checks every field and shape."""

    index: int
    text: str
    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    causal: bool
    patterns: list
    rollout: list
    flow_query: int
    flow: list | None = None

    @classmethod
    def read(cls, doc: Any, where: str) -> ViewerText:
        doc = as_dict(doc, where)
        tokens = tuple(need(t, str, f"{where}.tokens[{i}]")
                       for i, t in enumerate(need(doc.get("tokens"), list, f"{where}.tokens")))
        special = tuple(need(s, bool, f"{where}.special[{i}]")
                        for i, s in enumerate(need(doc.get("special"), list, f"{where}.special")))
        n = len(tokens)
        if len(special) != n:
            raise Bad(f"{where}.special has {len(special)} entries for {n} tokens")
        patterns = _array(doc.get("patterns"), 4, f"{where}.patterns")
        if patterns.shape[2:] != (n, n):
            raise Bad(f"{where}.patterns is {_shape(patterns)}, not layers x heads x {n} x {n}")
        rollout = _array(doc.get("rollout"), 3, f"{where}.rollout")
        if rollout.shape != (patterns.shape[0], n, n):
            raise Bad(f"{where}.rollout is {_shape(rollout)}, not {patterns.shape[0]} x {n} x {n}")
        query = need(doc.get("flow_query"), int, f"{where}.flow_query")
        if isinstance(query, bool) or not 0 <= query < max(n, 1):
            raise Bad(f"{where}.flow_query is {query!r}, not a token position below {n}")
        flow = None if doc.get("flow") is None else _array(doc.get("flow"), 1, f"{where}.flow")
        if flow is not None and flow.shape != (n,):
            raise Bad(f"{where}.flow has {flow.size} values for {n} tokens")
        return cls(index=need(doc.get("index"), int, f"{where}.index"), text=need(doc.get("text"), str, f"{where}.text"),
                   tokens=tokens, special=special, causal=need(doc.get("causal"), bool, f"{where}.causal"),
                   patterns=patterns.tolist(), rollout=rollout.tolist(), flow_query=query,
                   flow=None if flow is None else flow.tolist())

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text, "tokens": list(self.tokens), "special": list(self.special),
                "causal": self.causal, "patterns": self.patterns, "rollout": self.rollout,
                "flow_query": self.flow_query, "flow": self.flow}


def _shape(values) -> str:
    return " x ".join(str(n) for n in values.shape)


def _array(value: Any, ndim: int, where: str):
    """``value`` as a float array of ``ndim`` dimensions, every entry a finite number (handed on as floats)."""
    import numpy as np

    ok = isinstance(value, list)
    try:
        got = np.asarray(value, dtype=np.float64) if ok else None
    except (TypeError, ValueError):
        ok = False
    if not ok or got.ndim != ndim or not np.isfinite(got).all():
        raise Bad(f"{where} is not a {ndim}-dimensional grid of finite numbers")
    return got


VIEWER = Records("viewer", ViewerText.read)  # what run attention declares (analyses/attention.py)


def viewer_section(results):
    """report.html's attention viewer over typed ``results`` (None where no model kept texts in full)."""
    from layerscope.report.html_figures import Section

    texts = {model: [t.to_json() for t in fig.records(VIEWER)] for model, fig in results.per_model.items()}
    texts = {model: shown for model, shown in texts.items() if shown}
    if not texts:
        return None
    return Section("viewer", "Attention viewer", html=HTML, css=CSS, script=SCRIPT, data={"attention_viewer": texts},
                   intro="One text at a time: pick a layer (or the rollout) and a head (or their mean).")
