"""run token_probe: each layer's accuracy equals scikit-learn's logistic regression on word vectors from plain
Hugging Face (first piece), on the run's split; the control task scores on the same words; labels that do not
align with the tokens are one line."""

from __future__ import annotations

import numpy as np
import pytest

from hf_reference import load_plain
from layerscope.analyses.base import Context, RunRequest, run_analysis
from layerscope.errors import InputError

DET, ADJ, NOUN, VERB = ("the", "a"), ("quick", "lazy", "warm", "brown"), ("fox", "dog", "cat", "layer"), \
    ("sat", "jumps", "refines")


def _sentences(n=40, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(int(rng.integers(1, 3))):
            for group, tag in ((DET, "DET"), (ADJ, "ADJ"), (NOUN, "NOUN"), (VERB, "VERB")):
                words.append(str(rng.choice(group)))
                tags.append(tag)
        out.append((words, tags))
    return out


def _conllu(path, sentences):
    lines = []
    for words, tags in sentences:
        lines += [f"{i}\t{w}\t{w}\t{t}\t_\t_\t0\tdep\t_\t_" for i, (w, t) in enumerate(zip(words, tags), 1)] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _req(model, data, out, **kw):
    return RunRequest(models=[str(model)], engine="torch", layers="0,2", data=str(data), out=out, seed=1,
                      cache=False, **kw)


def test_accuracy_equals_scikit_learn_on_hugging_face_word_vectors(tiny_model, tmp_path):
    import torch
    from sklearn.linear_model import LogisticRegression

    from layerscope.analyses.token_probe import TokenProbe

    model = tiny_model("bert")
    sents = _sentences()
    data = _conllu(tmp_path / "tags.conllu", sents)
    out = tmp_path / "run"
    _, results = run_analysis("token_probe", _req(model, data, out))
    fig = next(iter(results["per_model"].values()))
    rows = {r["layer"]: r for r in fig["tables"]["token_probe_layers"]}
    test = TokenProbe().prepare(Context.asked(TokenProbe, _req(model, data, out)))["test"]
    tok, hf = load_plain(model, "bert")
    vec = {"0": [], "2": []}
    for words, _ in sents:
        enc = tok(" ".join(words), return_offsets_mapping=True, return_tensors="np")
        with torch.no_grad():
            hs = hf(input_ids=torch.as_tensor(enc["input_ids"]), output_hidden_states=True).hidden_states
        starts = [o[0] for o in enc["offset_mapping"][0]]
        at = 0
        for w in words:  # the first token starting at the word's first character
            first = starts.index(at, 1)
            for layer in vec:
                vec[layer].append(hs[int(layer)][0, first].double().numpy())
            at += len(w) + 1
    gold = np.array([t for _, tags in sents for t in tags])
    on_test = np.repeat(test, [len(w) for w, _ in sents])
    for layer in ("0", "2"):
        x = np.stack(vec[layer])
        z = (x - x[~on_test].mean(0)) / np.where(x[~on_test].std(0) > 0, x[~on_test].std(0), 1)
        ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit(z[~on_test], gold[~on_test])
        want = float(np.mean(ref.predict(z[on_test]) == gold[on_test]))
        row = rows[layer]
        assert row["accuracy"] == pytest.approx(want, abs=1.01 / on_test.sum())
        assert row["selectivity"] == pytest.approx(row["accuracy"] - row["control_accuracy"])
        for key in ("accuracy", "control_accuracy", "selectivity"):
            assert row[f"{key}_ci_low"] <= row[key] <= row[f"{key}_ci_high"]
    assert fig["summary"]["test_words"] == int(on_test.sum())
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "control task" in page and "majority label" in page


def test_labels_that_do_not_align_are_one_line(tiny_model, tmp_path):
    data = _conllu(tmp_path / "long.conllu", _sentences(12, seed=2))
    with pytest.raises(InputError, match="do not align with .*has no token: the text was cut at the max length"):
        run_analysis("token_probe", _req(tiny_model("bert"), data, tmp_path / "o", max_length=6))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"words": ["the", "cat"], "labels": ["DET"]}\n', encoding="utf-8")
    with pytest.raises(InputError, match="bad.jsonl:1: 2 words but 1 labels"):
        run_analysis("token_probe", _req(tiny_model("bert"), bad, tmp_path / "p"))
