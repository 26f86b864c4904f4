"""``run lens --tuned``: logit vs tuned figures per layer, on every engine, against the lens written out by hand
with the checkpoint's own head (transformers) and SciPy's KL; bad lenses one line before any work; a lens
retrained in the same folder is another run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

TEXTS = ["the cat sat on the mat", "water flows past old towns", "birds sing over the quiet river bank"]
WORDS = "the cat sat on a mat while rivers flow past old towns and birds sing over quiet hills".split()


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """``trained(family) -> (model dir, lens dir)``: a peaked tiny model and a tuned lens trained on 30 texts."""
    from layerscope.decoding.tuned_record import TrainSettings
    from layerscope.decoding.tuned_train import train_lens
    from layerscope.extraction.pipeline import extract
    from tuned_models import sharpened

    made = {}

    def get(family):
        if family not in made:
            root = tmp_path_factory.mktemp(f"lens-tuned-{family}")
            kind = "encoder" if family == "bert" else "decoder"
            model = sharpened(tiny_model(family), root / "model", kind)
            rng = np.random.default_rng(0)
            texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) for _ in range(30)]
            extract(str(model), texts, root / "store", engine="torch", layers="all", poolings=["mean"], tokens=True)
            train_lens(root / "store", root / "lens", settings=TrainSettings(steps=12, tokens_per_step=128))
            made[family] = (model, root / "lens")
        return made[family]

    return get


def _by_hand(model_dir, lens_dir, decoder: bool):
    """Per lens ("logit", "tuned") and layer: mean KL(final || layer) (SciPy's rel_entr), perplexity of the target
    and top-1 agreement with the final layer, over the non-special targets of TEXTS, from transformers' model."""
    from scipy.special import log_softmax, rel_entr
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from layerscope.decoding.tuned_lens import read_lens

    tr = read_lens(lens_dir).translators
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = (AutoModelForCausalLM if decoder else AutoModelForMaskedLM).from_pretrained(str(model_dir)).eval()
    n_layers = net.config.num_hidden_layers
    special = set(tok.all_special_ids)

    def head(h, layer):
        if not decoder:
            return net.cls(h)
        return net.lm_head(h if layer == n_layers else net.transformer.ln_f(h))

    sums = {(lens, j): [0.0, 0.0, 0] for lens in ("logit", "tuned") for j in range(n_layers + 1)}
    count = 0
    for text in TEXTS:
        enc = tok(text, return_tensors="pt")
        ids = enc["input_ids"][0].numpy()
        with torch.no_grad():
            hidden = net(**enc, output_hidden_states=True).hidden_states
            final = log_softmax(head(hidden[-1], n_layers)[0].double().numpy(), axis=-1)
        positions = range(len(ids) - 1) if decoder else range(len(ids))
        counted = [p for p in positions if int(ids[p + 1 if decoder else p]) not in special]
        count += len(counted)
        for j in range(n_layers + 1):
            for lens in ("logit", "tuned"):
                h = hidden[j][0]
                if lens == "tuned" and j < n_layers:
                    h = torch.from_numpy(tr.apply(h.numpy(), j).astype(np.float32))
                with torch.no_grad():
                    q = log_softmax(head(h[None], j)[0].double().numpy(), axis=-1)
                for p in counted:
                    target = int(ids[p + 1 if decoder else p])
                    s = sums[(lens, j)]
                    s[0] += rel_entr(np.exp(final[p]), np.exp(q[p])).sum()
                    s[1] -= q[p, target]
                    s[2] += int(q[p].argmax() == final[p].argmax())
    return {key: (kl / count, float(np.exp(nll / count)), agree / count) for key, (kl, nll, agree) in sums.items()}


@pytest.mark.parametrize("family,engine", [("bert", "torch"), ("bert", "ort"), ("gpt2", "ov")])
def test_logit_vs_tuned_table_equals_a_hand_computed_lens(trained, tmp_path, monkeypatch, family, engine):
    """Catches: the tuned rows decoded without the translators (or the logit rows with them), KL averaged over
    positions the other figures leave out (special targets, a decoder's last token), the perplexity not the
    exponential of the mean negative log-probability, the tuned graph failing on ort or ov, and an interval that
    does not hold its own estimate. An encoder's target is its input token, a decoder's the next one."""
    if engine == "ov":
        pytest.importorskip("openvino")
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    model, lens = trained(family)
    data = tmp_path / "held-out.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    req = RunRequest(models=[str(model)], engine=engine, out=tmp_path / "out", poolings=["mean"], cache=False,
                     data=str(data), layers="all", options={"top_k": 3, "show": 1, "tuned": str(lens)})
    _, results = run_analysis("lens", req)
    fig = next(iter(results["per_model"].values()))
    rows = fig["tables"]["tuned_vs_logit"]
    want = _by_hand(model, lens, family != "bert")
    assert [(r["layer"], r["lens"]) for r in rows] == [(str(j), lens) for j in range(3) for lens in ("logit", "tuned")]
    for r in rows:
        kl, perplexity, agree = want[(r["lens"], int(r["layer"]))]
        assert r["kl_to_final"] == pytest.approx(kl, rel=1e-4, abs=1e-6)
        assert r["perplexity"] == pytest.approx(perplexity, rel=1e-4)
        assert r["top1_agrees_with_last"] == pytest.approx(agree, abs=1e-9)
        for key in ("kl_to_final", "perplexity"):
            assert r[f"{key}_ci_low"] - 1e-12 <= r[key] <= r[f"{key}_ci_high"] + 1e-12
    tuned0 = next(r for r in rows if r["lens"] == "tuned" and r["layer"] == "0")
    logit0 = next(r for r in rows if r["lens"] == "logit" and r["layer"] == "0")
    assert tuned0["kl_removed"] == pytest.approx(logit0["kl_to_final"] - tuned0["kl_to_final"], abs=1e-12)
    assert abs(tuned0["kl_to_final"] - logit0["kl_to_final"]) > 1e-3  # not vacuous: the translators change layer 0
    by_layer = fig["tables"]["lens_by_layer"]  # the logit lens's own table carries the same figures
    assert [r["kl_to_final"] for r in by_layer] == [r["kl_to_final"] for r in rows if r["lens"] == "logit"]
    assert fig["tuned_lens"]["trained_by"] == "layerscope"
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "logit vs tuned lens, KL to the final distribution" in html and (tmp_path / "out" / "tuned_kl.png").is_file()


def test_a_lens_that_does_not_fit_is_one_line_before_any_work(trained, tiny_model, tmp_path, monkeypatch):
    """Catches: a lens of another model (width or layer count), or a folder that is no lens, failing deep in
    decoding or, worse, broadcasting; a lens retrained in the same folder reusing the earlier run's figures."""
    from layerscope.decoding.tuned_lens import LensConfig, Translators, write_lens

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    model, lens = trained("gpt2")
    data = tmp_path / "t.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")

    def run(tuned, out="out", **kw):
        return run_analysis("lens", RunRequest(models=[str(model)], engine="ort", out=tmp_path / out, data=str(data),
                                               poolings=["mean"], cache=False, options={"tuned": str(tuned)}, **kw))

    write_lens(tmp_path / "wide", Translators.identity(2, 64), LensConfig("m", 64, 2))
    with pytest.raises(InputError, match="is 64 wide, the model's layers are 32") as err:
        run(tmp_path / "wide")
    assert "\n" not in str(err.value) and not list((tmp_path / "home").rglob("*.onnx"))  # nothing exported
    with pytest.raises(InputError, match="has no config.json"):
        run(tmp_path)
    import shutil

    copy = tmp_path / "lens-copy"
    shutil.copytree(lens, copy)
    run(copy)
    from layerscope.decoding.tuned_lens import read_lens

    write_lens(copy, Translators.identity(2, 32), read_lens(copy).config)
    (copy / "lens.json").unlink()  # a plain tuned-lens folder now, other translators
    with pytest.raises(InputError, match=r"a run that differs in options\.tuned\.sha256"):
        run(copy)
