"""The lens graph check accepts rank swaps between near-equal logits and only those."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from layerscope.decoding.lens import rank_bands


def _fake_model(logits: torch.Tensor):
    class Base:
        def __call__(self, **kw):
            return SimpleNamespace(hidden_states=[logits])

    return SimpleNamespace(family=SimpleNamespace(kind="encoder"), base=Base(), head=lambda h, layer: h)


def test_rank_band_spans_ties_only():
    # vocab of 5; position 0's target (id 2) ties with id 4 within 1e-5 (relative 2e-6), id 0 is clearly above
    logits = torch.tensor([[[9.0, 1.0, 5.0, 2.0, 5.0 + 1e-5], [0.0, 3.0, 1.0, 2.0, 0.5]]])
    inputs = {"input_ids": torch.tensor([[2, 3]]), "attention_mask": torch.tensor([[1, 1]])}
    lo, hi = rank_bands(_fake_model(logits), inputs, [0], 1e-5)
    assert lo.tolist() == [[[2, 2]]] and hi.tolist() == [[[3, 2]]]
    onnx_rank = np.array([[[3, 2]]])  # the tie swapped: still inside the band
    assert not ((onnx_rank < lo) | (onnx_rank > hi)).any()
    wrong = np.array([[[4, 1]]])  # a real disagreement on both positions
    assert ((wrong < lo) | (wrong > hi)).all()
    lo0, hi0 = rank_bands(_fake_model(logits), inputs, [0], 0.0)  # no tolerance: exact rank only for non-ties
    assert lo0[0, 0, 0] == 3 and hi0[0, 0, 0] == 3


def test_padding_has_no_band():
    logits = torch.zeros(1, 2, 4)
    inputs = {"input_ids": torch.tensor([[1, 0]]), "attention_mask": torch.tensor([[1, 0]])}
    lo, hi = rank_bands(_fake_model(logits), inputs, [0], 1e-5)
    assert lo[0, 0, 1] == 0 and hi[0, 0, 1] == 0 and lo[0, 0, 0] == 1 and hi[0, 0, 0] == 4
