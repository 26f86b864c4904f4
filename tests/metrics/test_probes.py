"""Token probes: the linear probe is scikit-learn's LogisticRegression objective at its optimum; words align
to tokens exactly or not at all; control labels are fixed per word type; CoNLL-U and JSONL read as written."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.metrics import probes


def test_probe_is_scikit_learns_logistic_regression_at_its_optimum():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)) * [1, 2, 3, 1, 1, 5] + [0, 1, 0, 0, 3, 0]
    y = np.array(["a", "b", "c"])[np.argmax(x[:, :3] + rng.normal(scale=1.5, size=(120, 3)), axis=1)]
    for c in (0.1, 1.0):
        ours = probes.LinearProbe.fit(x, y, c=c)
        z = (x - x.mean(0)) / x.std(0)
        ref = LogisticRegression(C=c, tol=1e-10, max_iter=5000).fit(z, y)
        assert ours.converged
        # the same strictly convex objective: the same probabilities, hence the same predictions
        p_ours = np.exp(ours.scores(x) - ours.scores(x).max(1, keepdims=True))
        p_ours /= p_ours.sum(1, keepdims=True)
        assert np.abs(p_ours - ref.predict_proba(z)).max() < 1e-5
        assert (ours.predict(x) == ref.predict(z)).all()


def test_words_align_to_their_pieces_or_say_where_they_do_not():
    # "unhappy cats" -> [CLS] un happy cat s [SEP]
    spans = np.array([[0, 0], [0, 2], [2, 7], [8, 11], [11, 12], [0, 0]])
    special = np.array([1, 0, 0, 0, 0, 1])
    pieces = probes.word_tokens(spans, special, [(0, 7), (8, 12)])
    assert [p.tolist() for p in pieces] == [[1, 2], [3, 4]]
    states = np.arange(12, dtype=float).reshape(6, 2)
    assert probes.word_vectors(states, pieces, "first").tolist() == [[2, 3], [6, 7]]
    assert probes.word_vectors(states, pieces, "last").tolist() == [[4, 5], [8, 9]]
    assert probes.word_vectors(states, pieces, "mean").tolist() == [[3, 4], [7, 8]]
    with pytest.raises(probes.Misaligned, match="word 2 .* has no token"):  # cut at the max length
        probes.word_tokens(spans[:3], special[:3], [(0, 7), (8, 12)])
    merged = np.array([[0, 0], [0, 9], [9, 12], [0, 0]])  # one token over "unhappy c"
    with pytest.raises(probes.Misaligned, match="reaches past word 1"):
        probes.word_tokens(merged, np.array([1, 0, 0, 1]), [(0, 7), (8, 12)])


def test_control_labels_are_one_per_word_type_from_the_label_distribution():
    words = ["the", "cat", "the", "dog", "a", "cat"] * 50
    labels = ["DET", "NOUN", "DET", "NOUN", "DET", "NOUN"] * 50
    ctl = probes.control_labels(words, labels, seed=3)
    assert set(ctl) == {"the", "cat", "dog", "a"} and set(ctl.values()) <= {"DET", "NOUN"}
    assert ctl == probes.control_labels(words, labels, seed=3)
    draws = [tuple(probes.control_labels([str(i) for i in range(400)], labels[:2], seed=s).values()).count("DET")
             for s in range(3)]
    assert all(150 < d < 250 for d in draws)  # half the labels are DET


def test_conllu_and_jsonl_read_as_written(tmp_path):
    from layerscope.data.tagged import read_tagged
    from layerscope.errors import InputError

    conllu = tmp_path / "s.conllu"
    conllu.write_text("# text = Don't go.\n1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_\n"
                      "2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_\n3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_\n"
                      "3.1\tgone\t_\t_\t_\t_\t_\t_\t_\t_\n4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_\n\n", encoding="utf-8")
    (s,) = read_tagged(conllu)
    assert s.words == ("Do", "n't", "go", ".") and s.labels == ("AUX", "PART", "VERB", "PUNCT")
    assert s.text == "Do n't go ." and s.spans == [(0, 2), (3, 6), (7, 9), (10, 11)]
    assert read_tagged(conllu, column="deprel")[0].labels == ("aux", "advmod", "root", "punct")
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text('{"words": ["a", "b"], "labels": ["X", "Y"]}\n{"words": ["c"], "labels": []}\n', encoding="utf-8")
    with pytest.raises(InputError, match="s.jsonl:2: 1 words but 0 labels"):
        read_tagged(jsonl)
