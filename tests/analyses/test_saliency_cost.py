"""A saliency run says what it costs (texts x methods x steps, passes per text) before its first text, and
offers the small run when it is larger."""

from __future__ import annotations

import io
import json

import pytest

from layerscope.analyses.saliency import saliency_cost


def test_the_cost_line_read_by_hand():
    # 60 texts, 7 decoded layers, no gxa: 7 + grad x input + integrated gradients = 9 methods; 9 + 3 random
    # draws = 12 rankings, each hidden and revealed at k = 1..10: 240 variants, + full and all-hidden = 242;
    # 1 backward pass + 20 integrated-gradient points per text: 21 x 60 = 1,260
    assert saliency_cost(60, 7, gxa=False, ig_steps=20, k=10, random_draws=3) == (
        "saliency costs 60 texts x 9 methods x 20 integrated-gradient steps: per text 21 forward+backward passes, "
        "7 layers decoded through the head and up to 242 masked forward passes for the games; 1,260 backward "
        "passes in all. A quick look first: --max-texts 10 --ig-steps 5")
    # gxa doubles the per-layer methods (2 x 2 + 2 = 6; 6 + 1 draw = 7 rankings x 2 x 3 + 2 = 44); a run no larger
    # than the quick one offers nothing smaller
    assert saliency_cost(4, 2, gxa=True, ig_steps=5, k=3, random_draws=1) == (
        "saliency costs 4 texts x 6 methods x 5 integrated-gradient steps: per text 6 forward+backward passes, "
        "2 layers decoded through the head and up to 44 masked forward passes for the games; 24 backward passes "
        "in all")


def test_a_run_says_its_cost_before_its_first_text(tiny_model, tmp_path, monkeypatch):
    """Catches: the cost said after the work (or never), and a count of texts other than those explained."""
    from rich.console import Console

    import layerscope.decoding.saliency as saliency
    from layerscope.analyses.base import RunRequest, run_analysis

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                            ["a lovely warm day in the park", "the food was great", "we had a terrible time"]))
    out = io.StringIO()

    class Started(Exception):
        pass

    def first_text(*args, **kwargs):
        raise Started(out.getvalue())

    monkeypatch.setattr(saliency, "text_scores", first_text)
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", out=tmp_path / "out", poolings=["mean"],
                     cache=False, data=str(data), layers="1,2", console=Console(file=out, width=400),
                     options={"objective": "similarity", "reference": "a day in the park", "k": 2, "ig_steps": 3,
                           "max_texts": 2})
    with pytest.raises(Started) as said:
        run_analysis("saliency", ctx)
    assert ("saliency costs 2 texts x 4 methods x 3 integrated-gradient steps: per text 4 forward+backward "
            "passes, 2 layers decoded through the head") in said.value.args[0]
