"""``run attention``: per-head figures equal per-text summaries taken alone, the viewer's patterns equal
transformers' eager attention, bad input is one line before any folder, and report.html's viewer draws in
Chromium with text from the data kept as text."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError
from layerscope.export import attention as att
from layerscope.export.attention_run import AttentionRunner
from layerscope.export.variants import make_variant

PAYLOAD = "<img src=x onerror=\"console.error('INJECTED')\"> & </script>"
TEXTS = ["The cat sat on the mat.", "a", "Dogs run in the park every morning before work.", PAYLOAD,
         "A man plays a guitar."]


@pytest.fixture(scope="module")
def exports(tiny_export):
    cache = {}

    def get(family, attn=True):
        key = (family, attn)
        if key not in cache:
            out = tiny_export(family)
            if attn:
                make_variant(out, "attn")
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("attn-data") / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(exports, data, tmp_path_factory):
    done = {}

    def get(family):
        if family not in done:
            out = tmp_path_factory.mktemp(f"attn-result-{family}") / "r"
            ctx = RunRequest(models=[str(exports(family))], data=str(data), out=out, options={"patterns": 4})
            done[family] = run_analysis("attention", ctx)
        return done[family]

    return get


def _hf_attention(source, text, decoder):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    net = AutoModel.from_pretrained(str(source), attn_implementation="eager").eval()
    enc = tok([text], return_tensors="pt")
    with torch.no_grad():
        out = net(**enc, output_attentions=True, **({"use_cache": False} if decoder else {}))
    return np.stack([a[0].numpy() for a in out.attentions])  # [L, H, T, T]


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_head_means_equal_summaries_of_each_text_alone(family, runs, exports):
    """Batched, padded, aggregated: each head's mean over texts equals the mean of each text run alone."""
    out, results = runs(family)
    fig = next(iter(results["per_model"].values()))
    runner = AttentionRunner(exports(family), "ort")
    from layerscope.model.handle import ModelHandle

    encoder = ModelHandle.resolve(exports(family)).encoding_tokenizer()
    from layerscope.model.tokenize import Encoder

    enc = Encoder(encoder, list(runner.input_names), 128)
    alone = {s: np.stack([runner.run(enc([t]).inputs).summaries[s][0] for t in TEXTS]) for s in att.SUMMARIES}
    for row in fig["tables"]["attention_heads"]:
        layer, head = int(row["layer"]) - 1, row["head"]
        for s in att.SUMMARIES:
            values = alone[s][:, layer, head]
            assert row[s] == pytest.approx(float(np.nanmean(values)), abs=1e-5), (s, row)
            assert row[f"{s}_ci_low"] <= row[s] <= row[f"{s}_ci_high"]
    assert len(fig["tables"]["attention_heads"]) == 2 * 4
    assert sorted(p.name for p in out.glob("attention_*.png")) == sorted(f"attention_{s}.png" for s in att.SUMMARIES)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_viewer_patterns_equal_transformers(family, runs, tiny_model):
    _, results = runs(family)
    fig = next(iter(results["per_model"].values()))
    assert len(fig["viewer"]) == 4  # --patterns bounds the texts kept in full
    decoder = family == "gpt2"
    for entry in fig["viewer"]:
        ref = _hf_attention(tiny_model(family), entry["text"], decoder)
        np.testing.assert_allclose(np.array(entry["patterns"]), ref, atol=1e-4)
        assert entry["causal"] is decoder
        t = ref.shape[-1]
        assert len(entry["tokens"]) == t
        # flow from the pooled token: [CLS] for the encoder, the last token for the decoder
        assert entry["flow_query"] == (t - 1 if decoder else 0) and len(entry["flow"]) == t
        # the path through the token itself has capacity >= 0.5 at every layer (the residual's half identity)
        assert entry["flow"][entry["flow_query"]] >= 0.5 - 1e-4
        assert np.array(entry["rollout"]).shape == (2, t, t)


def test_one_token_text_by_hand(runs):
    """A one-token text attends only to itself: entropy 0, first-token share 1, distance 0, and no previous
    token (NaN, left out of the head's mean, never counted as 0)."""
    _, results = runs("gpt2")
    fig = next(iter(results["per_model"].values()))
    one = next(e for e in fig["viewer"] if e["text"] == "a")
    assert len(one["tokens"]) == 1
    assert np.array(one["patterns"]).ravel().tolist() == [1.0] * 8  # 2 layers x 4 heads x 1 x 1
    for row in fig["tables"]["attention_heads"]:
        assert row["previous"] is not None


def test_export_without_attention_graph_is_refused_first(exports, data, tmp_path):
    out = tmp_path / "r"
    with pytest.raises(InputError, match="--attentions"):
        run_analysis("attention", RunRequest(models=[str(exports("bert", attn=False))], data=str(data), out=out))
    assert not out.exists()


def test_engine_without_attention_graph_runner_is_refused(exports, data, tmp_path):
    with pytest.raises(InputError, match="ort, ov or torch"):
        run_analysis("attention", RunRequest(models=[str(exports("bert"))], engine="torch-fp16", data=str(data),
                                             out=tmp_path / "r"))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_viewer_draws_in_chromium(family, runs, tmp_path):
    from report.test_html_report import open_page  # the suite's headless Chromium runner

    out, results = runs(family)
    dom, console = open_page(out / "report.html", tmp_path / "profile")
    assert console == []  # no script error, and the payload's onerror never ran
    grid = dom[dom.index("id=\"attn-grid\""):]
    grid = grid[:grid.index("</table>")]
    first = next(iter(results["per_model"].values()))["viewer"][0]
    t = len(first["tokens"])
    assert grid.count("<tr") == t + 1  # a header row and one row per query token
    masked = grid.count('class="masked"')
    assert masked == (t * (t - 1) // 2 if family == "gpt2" else 0)  # causal: every key after the query
    assert "<img src=\"x\"" not in dom and "<img src=x" not in dom  # the text stays text
    options = re.findall(r"<option value=\"\d+\">([^<]*)</option>", dom)
    assert any("&lt;img src=x" in o for o in options)


def test_one_token_summaries_by_hand(exports):
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder

    runner = AttentionRunner(exports("gpt2"), "ort")
    enc = Encoder(ModelHandle.resolve(exports("gpt2")).encoding_tokenizer(), list(runner.input_names), 16)
    feed = enc(["a"]).inputs
    assert feed["input_ids"].shape == (1, 1)
    got = runner.run(feed).summaries
    np.testing.assert_allclose(got["entropy"], 0.0, atol=1e-6)
    np.testing.assert_allclose(got["first"], 1.0, atol=1e-6)
    np.testing.assert_allclose(got["distance"], 0.0, atol=1e-6)
    assert np.isnan(got["previous"]).all()


@pytest.mark.slow
def test_plain_model_gets_the_attention_graph_in_its_cached_export(tiny_model, data, in_tmp_home):
    """A plain model (not an export folder): its cached export gets the attention graph on first use, and
    the torch engine computes the same figures as ONNX Runtime on that graph."""
    from layerscope.model.home import cache_root

    ctx = dict(models=[str(tiny_model("bert"))], data=str(data), options={"patterns": 1})
    _, torch_run = run_analysis("attention", RunRequest(engine="torch", out=in_tmp_home / "t", **ctx))
    entries = [p for p in (cache_root() / "exports").iterdir() if (p / att.FILE).is_file()]
    assert len(entries) == 1
    _, ort_run = run_analysis("attention", RunRequest(engine="ort", out=in_tmp_home / "o", **ctx))
    a = next(iter(torch_run["per_model"].values()))["tables"]["attention_heads"]
    b = next(iter(ort_run["per_model"].values()))["tables"]["attention_heads"]
    for ra, rb in zip(a, b):
        for s in att.SUMMARIES:
            assert ra[s] == pytest.approx(rb[s], abs=1e-5)


def test_two_models_side_by_side_on_the_same_texts(exports, data, tmp_path):
    """An encoder and a decoder in one run: the side-by-side table holds each model's per-layer first-token
    share as its own table says, and the paired difference is the difference of the two."""
    ctx = RunRequest(models=[str(exports("bert")), str(exports("gpt2"))], labels=["enc", "dec"], data=str(data),
                     out=tmp_path / "r", options={"patterns": 1})
    _, results = run_analysis("attention", ctx)
    tables = results["combined"]["tables"]
    layers = {m: {r["layer"]: r["first"] for r in results["per_model"][m]["tables"]["attention_layers"]}
              for m in ("enc", "dec")}
    assert len(tables["side_by_side"]) == 2
    same = [r for r in tables["model_comparison"] if r.get("comparison") == "same layer"]
    assert len(same) == 2
    for row in same:
        layer = str(row["layer_a"]).split()[-1]
        assert row["difference"] == pytest.approx(layers["enc"][layer] - layers["dec"][layer], abs=1e-9)
        assert row["ci_low"] <= row["difference"] <= row["ci_high"]


def test_size_said_before_the_run_matches_results_json(runs):
    """The pattern size announced before the run is within a third of what the viewer's texts take."""
    from layerscope.analyses.attention import pattern_bytes

    out, results = runs("bert")
    viewer = next(iter(results["per_model"].values()))["viewer"]
    said = pattern_bytes([len(v["tokens"]) for v in viewer], 2, 4)
    saved = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for fig in saved["per_model"].values():
        fig["viewer"] = []
    written = (out / "results.json").stat().st_size - len(json.dumps(saved, indent=2, ensure_ascii=False))
    assert 0.67 < said / written < 1.33, (said, written)


def test_batches_keep_the_padded_patterns_under_the_budget(monkeypatch):
    from layerscope.analyses import attention as analysis

    monkeypatch.setattr(analysis, "PATTERN_BYTES", 4 * 2 * 100)  # room for one 10-token text: two 10x10 maps
    lengths = np.array([10, 3, 10, 5, 1])
    order = np.argsort(lengths, kind="stable")  # 1, 3, 5, 10, 10 tokens
    got = [list(b) for b in analysis.batches(order, lengths, maps=2)]
    # by hand: 1+3+5 tokens fit together (3 texts x 2 maps x 25 floats x 4 bytes = 600 <= 800); a 10-token
    # text needs 800 bytes alone, so each goes by itself
    assert got == [[4, 1, 3], [0], [2]]
    assert sorted(i for b in got for i in b) == list(range(5))
