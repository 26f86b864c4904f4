"""run sae: an SAE saved by SAELens encodes a token store's layer exactly as SAELens's own encode and decode do
(standard, JumpReLU and TopK; each normalisation its files carry), and an SAE of another width or hook, or a
store without tokens, is one line before any token is read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

sae_lens = pytest.importorskip("sae_lens")
torch = pytest.importorskip("torch")
from sae_lens.saes.sae import SAEMetadata  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran <b>fast</b> & far", "layers refine the hidden states",
         "numbers turn into vectors", "the quick brown fox", "each layer of a transformer"]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def store(tiny_model, tmp_path_factory):
    from layerscope.extraction.pipeline import extract

    out = tmp_path_factory.mktemp("sae-store") / "s"
    extract(str(tiny_model("bert")), TEXTS, out, engine="torch", layers="1,2", poolings=["mean"], tokens=True)
    return out


def _save(tmp_path, name, cfg_cls, seed=0, d_in=32, d_sae=48, hook="blocks.0.hook_resid_post", **cfg):
    torch.manual_seed(seed)
    sae = sae_lens.SAE.from_dict(cfg_cls(d_in=d_in, d_sae=d_sae, metadata=SAEMetadata(hook_name=hook),
                                         **cfg).to_dict())
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(torch.rand_like(sae.threshold) * 0.3)
    sae.save_model(tmp_path / name)
    return sae, tmp_path / name


def _req(store, sae_dir, out, **options):
    return RunRequest(models=["minilm"], out=out, seed=0, options={"sae": str(sae_dir), "store": str(store),
                                                                   "features": 48, **options})


@pytest.mark.parametrize("kind", ["standard", "jumprelu", "topk", "standard-layer-norm", "topk-rescaled-norm"])
def test_figures_equal_saelens_encode_and_decode(store, tmp_path, kind):
    from layerscope.store.store import LayerStore

    cls, extra = {"standard": (sae_lens.StandardSAEConfig, {}), "jumprelu": (sae_lens.JumpReLUSAEConfig, {}),
                  "topk": (sae_lens.TopKSAEConfig, {"k": 5}),
                  "standard-layer-norm": (sae_lens.StandardSAEConfig, {"normalize_activations": "layer_norm"}),
                  "topk-rescaled-norm": (sae_lens.TopKSAEConfig, {"k": 4, "rescale_acts_by_decoder_norm": True,
                                                                  "normalize_activations": "constant_norm_rescale"})
                  }[kind]
    sae, folder = _save(tmp_path, kind, cls, **extra)
    _, results = run_analysis("sae", _req(store, folder, tmp_path / "out"))
    fig = next(iter(results["per_model"].values()))
    tl = LayerStore.open(store).tokens("1")  # blocks.0.hook_resid_post = layer 1
    rows = np.nonzero(np.asarray(tl.special) == 0)[0]
    x = torch.as_tensor(tl.take(rows))
    with torch.no_grad():
        acts = sae.encode(x)
        recon = sae.decode(acts).double().numpy()
    acts = acts.double().numpy()
    xd = x.double().numpy()
    s = fig["summary"]
    assert s["fvu"] == pytest.approx(((xd - recon) ** 2).sum() / ((xd - xd.mean(0)) ** 2).sum(), rel=1e-4)
    assert s["l0"] == pytest.approx((acts > 0).sum(1).mean(), abs=1e-9)
    assert s["dead"] == int(((acts > 0).sum(0) == 0).sum()) and s["tokens"] == len(rows)
    assert s["layer"] == "1" and s["hook"] == "blocks.0.hook_resid_post"
    texts = LayerStore.open(store).texts()
    for feat in fig["features"]:
        f = feat["feature"]
        assert feat["frequency"] == pytest.approx(float((acts[:, f] > 0).mean()))
        assert feat["max_activation"] == pytest.approx(float(acts[:, f].max()), rel=1e-4)
        top = rows[np.argmax(acts[:, f])]
        a, b = tl.spans[top]
        text = texts[int(np.searchsorted(np.asarray(tl.offsets), top, side="right") - 1)]
        assert f"[[{text[a:b]}]]" in feat["contexts"][0]["context"]
    assert sum(r["features"] for r in fig["tables"]["sae_frequencies"]) == 48 - s["dead"]


def test_contexts_reach_the_page_escaped(store, tmp_path):
    _, folder = _save(tmp_path, "std", sae_lens.StandardSAEConfig, d_sae=8)
    out = tmp_path / "page"
    _, results = run_analysis("sae", _req(store, folder, out, features=8, top=6))
    page = (out / "report.html").read_text(encoding="utf-8")
    shown = [c["context"] for f in next(iter(results["per_model"].values()))["features"] for c in f["contexts"]]
    assert any("<b>" in c for c in shown)  # a context of the text that holds markup
    assert "<b>fast" not in page and "&lt;b&gt;" in page


def test_bad_sae_or_store_is_one_line_before_tokens_are_read(store, tmp_path, tiny_model):
    from layerscope.extraction.pipeline import extract

    _, wide = _save(tmp_path, "wide", sae_lens.StandardSAEConfig, d_in=64)
    with pytest.raises(InputError, match="width 64; layer 1 .* has width 32: an SAE of another model"):
        run_analysis("sae", _req(store, wide, tmp_path / "a"))
    _, deep = _save(tmp_path, "deep", sae_lens.StandardSAEConfig, hook="blocks.7.hook_resid_post")
    with pytest.raises(InputError, match="block 7; this model has blocks 0-1"):
        run_analysis("sae", _req(store, deep, tmp_path / "b"))
    _, unstored = _save(tmp_path, "pre0", sae_lens.StandardSAEConfig, hook="blocks.0.hook_resid_pre")
    with pytest.raises(InputError, match="reads blocks.0.hook_resid_pre = layer 0; .* holds token vectors of layers 1, 2"):
        run_analysis("sae", _req(store, unstored, tmp_path / "c"))
    _, mlp = _save(tmp_path, "mlp", sae_lens.StandardSAEConfig, hook="blocks.0.hook_mlp_out")
    with pytest.raises(InputError, match="not a residual-stream state"):
        run_analysis("sae", _req(store, mlp, tmp_path / "d"))
    _, scaled = _save(tmp_path, "avg", sae_lens.StandardSAEConfig, normalize_activations="expected_average_only_in")
    with pytest.raises(InputError, match="expected_average_only_in"):
        run_analysis("sae", _req(store, scaled, tmp_path / "e"))
    _, huge = _save(tmp_path, "huge", sae_lens.StandardSAEConfig)
    with open(huge / "cfg.json", "r+b") as f:  # a config without end: refused by its size, never read
        f.truncate(65 * 2**20)
    with pytest.raises(InputError, match="cfg.json is .* bytes, more than a JSON file of an SAE folder can be"):
        run_analysis("sae", _req(store, huge, tmp_path / "f"))
    _, fine = _save(tmp_path, "fine", sae_lens.StandardSAEConfig)
    cfg = json.loads((fine / "cfg.json").read_text())
    cfg["d_sae"] = 50
    (fine / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="W_enc is \\[32, 48\\], its cfg.json says \\[32, 50\\]"):
        run_analysis("sae", _req(store, fine, tmp_path / "f"))
    pooled = tmp_path / "pooled"
    extract(str(tiny_model("bert")), TEXTS, pooled, engine="torch", layers="1", poolings=["mean"])
    _, ok = _save(tmp_path, "ok", sae_lens.StandardSAEConfig)
    with pytest.raises(InputError, match="holds no token vectors"):
        run_analysis("sae", _req(pooled, ok, tmp_path / "g"))


def test_a_decoders_last_block_before_its_final_norm_is_no_stored_layer(tiny_model, tmp_path):
    from layerscope.extraction.pipeline import extract

    store = tmp_path / "gpt2"
    extract(str(tiny_model("gpt2")), TEXTS, store, engine="torch", layers="1,2", poolings=["mean"], tokens=True)
    _, last = _save(tmp_path, "last", sae_lens.StandardSAEConfig, hook="blocks.1.hook_resid_post")
    with pytest.raises(InputError, match="before the final norm, but this model's last layer is stored after it"):
        run_analysis("sae", _req(store, last, tmp_path / "o"))
    _, mid = _save(tmp_path, "mid", sae_lens.StandardSAEConfig, hook="blocks.1.hook_resid_pre")
    _, results = run_analysis("sae", _req(store, mid, tmp_path / "p"))  # the input of block 1 = layer 1
    assert next(iter(results["per_model"].values()))["summary"]["layer"] == "1"
