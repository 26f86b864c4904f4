"""The memory check before a ``--shard`` or Ray run: the same one line as an in-process extraction when the
longest text cannot fit, said before any engine starts; the corpus is tokenized for it only where the longest
text the plan allows (the max length) would not fit."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.engines import memory
from layerscope.errors import InputError
from layerscope.extraction import range_run
from layerscope.extraction.request import ExtractionRequest

LONG = " ".join(["the quick brown fox jumps over the lazy dog while a cat sat on the mat"] * 3)
TEXTS = ["a cat sat on the mat", LONG, "hi", "the dog runs", "Water boils at 100 degrees Celsius."]
# the tiny BERT (4 heads, 32 wide, 2 layers, 128 positions) by hand; a mean extraction of layers 0 and 1 on ort
# fetches the in-graph pooled vectors alone, so its derived graph (below every layer) pools each layer as it is
# made and holds one layer's states: attention 2*4*T*T (an encoder: whole), one layer's states T*32 and the
# feed-forward 4*T*32 fp32 floats. (A run of every layer runs the export's own graph, which holds them all.)
LAYERS = "0,1"
LONGEST = 98  # the long text's tokens ([CLS] and [SEP] included; tests/extraction/test_long_texts.py)


def floor(tokens: int) -> int:
    return (2 * 4 * tokens * tokens + 1 * tokens * 32 + 4 * tokens * 32) * 4


def _shard(bert_export, out, monkeypatch, available: int):
    from layerscope.extraction.shard_extract import extract_shard

    monkeypatch.setattr(memory, "available_bytes", lambda: available)
    started: list[int] = []
    real = range_run.open_engine_for
    monkeypatch.setattr(range_run, "open_engine_for", lambda *a: started.append(1) or real(*a))
    req = ExtractionRequest.of(bert_export, TEXTS, out, engine="ort", layers=LAYERS, poolings=["mean"])
    try:
        return extract_shard(req, 0, 1), started
    except InputError as exc:
        return exc, started


def test_a_shard_whose_longest_text_cannot_fit_is_refused_before_its_engine_starts(bert_export, tmp_path,
                                                                                   monkeypatch):
    got, started = _shard(bert_export, tmp_path / "s", monkeypatch, floor(LONGEST) - 1)
    assert isinstance(got, InputError) and started == []
    msg = str(got)
    assert msg.startswith(f"the longest text has {LONGEST} tokens") and "--max-length 97 or less" in msg, msg
    assert f"remove {tmp_path / 's'}" in msg and "\n" not in msg


def test_a_shard_whose_max_length_would_not_fit_but_whose_texts_do_runs(bert_export, tmp_path, monkeypatch):
    assert floor(128) > floor(LONGEST)  # the model's 128 positions would not fit; the corpus's longest does
    counted: list[int] = []
    from layerscope.model.tokenize import Encoder

    real = Encoder.token_lengths
    monkeypatch.setattr(Encoder, "token_lengths", lambda self, texts: counted.append(len(texts)) or real(self, texts))
    got, started = _shard(bert_export, tmp_path / "s", monkeypatch, floor(LONGEST))
    assert not isinstance(got, InputError), got
    assert got.complete and started == [1] and sum(counted) >= len(TEXTS)


def test_a_plan_that_fits_at_its_max_length_counts_no_tokens(bert_export, tmp_path, monkeypatch):
    from layerscope.extraction.prepare import check_ranges_fit, prepare_request
    from layerscope.model.tokenize import Encoder

    req = ExtractionRequest.of(bert_export, TEXTS, tmp_path / "s", engine="ort", layers=LAYERS, poolings=["mean"])
    ex = prepare_request(req)
    real = Encoder.token_lengths
    monkeypatch.setattr(Encoder, "token_lengths", lambda *a: pytest.fail("tokenized for nothing"))
    check_ranges_fit(ex, ex.choice, [object()], available=floor(128))  # the ranges are never read
    check_ranges_fit(ex, ex.choice, [object()], here=False)  # memory elsewhere, unknown: not refused
    monkeypatch.setattr(Encoder, "token_lengths", real)
    ex, store = range_run.open_or_create(req)  # spooled: the ranges' texts can be read
    ranges = range_run.ranges_of(store)
    # two engines at once (Ray actors on one machine) each need the longest text's floor
    check_ranges_fit(ex, ex.choice, ranges, available=2 * floor(LONGEST), workers=2)
    with pytest.raises(InputError, match=f"the longest text has {LONGEST} tokens.*for each of 2 workers"):
        check_ranges_fit(ex, ex.choice, ranges, available=2 * floor(LONGEST) - 1, workers=2)


PYTORCH_DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


def test_the_plan_of_each_engine_that_declares_its_precision_is_what_it_starts_as(tiny_model):
    """For every engine whose registry entry declares the precision it computes in (the PyTorch engines), the
    cost shape planned before it starts (``shape_planned``, what ``--shard`` and Ray check) equals the started
    engine's, at the default length, past SLICE_FROM and with the attention asked; and its weights are in that
    precision. Catches: the plan keeping its own table of engine precisions (torch-fp16 planned as fp32 eager,
    charged for a whole [heads, T, T] attention it never holds; an engine left out of that table)."""
    from layerscope.engines.base import create_engine
    from layerscope.engines.memory import shape_of, shape_planned
    from layerscope.engines.registry import engines, resolve_engine
    from layerscope.engines.torch import SLICE_FROM
    from layerscope.model.handle import ModelHandle

    declared = {name: spec.precision for name, spec in engines().items() if spec.precision is not None}
    assert declared == {"torch": "fp32", "torch-fp16": "fp16", "torch-bf16": "bf16"}
    handle = ModelHandle.resolve(str(tiny_model("bert")))
    seen = set()
    for name, precision in declared.items():
        for asked, max_seq in (({}, None), ({}, SLICE_FROM + 1), ({"attention": "eager"}, None),
                               ({"attention": "sdpa"}, None)):
            eng = create_engine(name, handle, device="cpu", max_seq=max_seq, **asked)
            for tokens in (False, True):  # a pooled run (one layer at a time, in hooks) and a run of token states
                planned = shape_planned(handle, resolve_engine(name, asked), depth=None, tokens=tokens,
                                        max_seq=max_seq)
                assert planned == shape_of(eng, tokens=tokens), (name, asked, max_seq, tokens)
                assert planned.layer_at_a_time is not tokens
            assert str(next(eng.net.parameters()).dtype) == PYTORCH_DTYPES[precision], name
            seen.add((name, planned.attention_scores))
    # both sides of the rule are met: fp32 eager by default (charged), sliced when long or in half precision
    assert {("torch", True), ("torch", False), ("torch-fp16", False), ("torch-bf16", False)} <= seen


class FakeRay:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_ray_share_of_memory_per_actor():
    from layerscope.extraction.prepare import ray_share

    assert ray_share(None, 3, 1.0, local=True) == {"workers": 3, "available": None, "here": True}
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "memory": 16e9}},  # 4 actors of 2 CPUs: 4e9 each
             {"Alive": True, "Resources": {"CPU": 2.0, "memory": 3e9}},  # 1 actor: 3e9
             {"Alive": False, "Resources": {"CPU": 2.0, "memory": 1e9}},  # dead: ignored
             {"Alive": True, "Resources": {"CPU": 1.0, "memory": 1e8}}]  # holds no actor of 2 CPUs: ignored
    assert ray_share(FakeRay(nodes), 6, 2.0, local=False) == {"workers": 1, "available": int(3e9), "here": False}
    assert ray_share(FakeRay([]), 2, 1.0, local=False)["available"] is None
    assert ray_share(FakeRay(nodes), 2, 1.0, 1.0, local=False) == {"workers": 1, "available": None, "here": False}


@pytest.mark.ray
def test_a_ray_run_whose_longest_text_cannot_fit_is_refused_before_any_actor(bert_export, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    from layerscope.extraction import ray_extract

    class NoActor:
        def __init__(self, *a, **k):
            raise AssertionError("an actor started")

    monkeypatch.setattr(memory, "available_bytes", lambda: floor(LONGEST) - 1)  # one range: one actor
    monkeypatch.setattr(ray_extract, "RangeActor", NoActor)
    with pytest.raises(InputError, match=f"the longest text has {LONGEST} tokens.*--max-length 97 or less"):
        ray_extract.extract_ray(bert_export, TEXTS, tmp_path / "s", address="local", workers=2, engine="ort",
                                layers=LAYERS, poolings=["mean"])
    assert not np.load(tmp_path / "s" / "done.npy").any()


def _qwen3_floor(tokens: int, *, rows: int | None, layers_alive: int) -> int:
    """The tiny Qwen3's floor by hand (4 heads, 32 wide): attention 2*4*T*rows floats (rows = T where computed
    whole), ``layers_alive`` layers' states T*32 each, the feed-forward 4*T*32; fp32."""
    return (2 * 4 * tokens * (tokens if rows is None else min(rows, tokens)) + layers_alive * tokens * 32
            + 4 * tokens * 32) * 4


@pytest.mark.parametrize("name", ["ort", "ov"])
def test_the_plan_of_the_onnx_engines_is_what_they_start_as(name, tiny_export, bert_export):
    """``shape_planned`` of ort and ov equals the started engine's ``shape_of``: blocks charged where the engine
    runs them (asked, or under auto past SLICE_FROM on a decoder), whole attention otherwise (an encoder, short
    runs, asked), one layer's states in a run of in-graph pooled vectors only below every layer (a derived graph
    that pools each layer as it is made), every layer read otherwise."""
    if name == "ov":
        pytest.importorskip("openvino")
    from layerscope.engines.base import create_engine
    from layerscope.engines.memory import shape_of, shape_planned
    from layerscope.engines.registry import resolve_engine
    from layerscope.model.handle import ModelHandle

    seen = set()
    for model in (tiny_export("qwen3", pooled=["mean"]), bert_export):
        handle = ModelHandle.resolve(str(model))
        for asked, max_seq in (({}, None), ({}, 512), ({}, 4096), ({"attention": "whole"}, 4096),
                               ({"attention": "blocked"}, None)):
            if asked.get("attention") == "blocked" and model == bert_export:
                continue  # refused when it starts (tests/test_blocked_attention.py)
            for pooled_only, depth in ((True, 1), (True, None), (False, None)):
                eng = create_engine(name, handle, max_seq=max_seq, pooled_only=pooled_only, depth=depth, **asked)
                for tokens in (False,) if pooled_only else (False, True):
                    planned = shape_planned(handle, resolve_engine(name, asked), depth=depth, tokens=tokens,
                                            max_seq=max_seq, pooled_only=pooled_only)
                    assert planned == shape_of(eng, tokens=tokens), (model.name, asked, max_seq, pooled_only, tokens)
                    seen.add((planned.attention_rows, planned.blocks_above, planned.layer_at_a_time))
    from layerscope.engines.torch import SLICE_FROM

    assert {(64, SLICE_FROM, True), (64, 0, True), (None, 0, True), (None, 0, False)} <= seen


def test_the_planned_floor_of_an_onnx_engine_by_hand(tiny_export):
    """What ``shape_planned`` charges ort for a text of T tokens on the tiny Qwen3 (pooled vectors of layers 0..1
    only, a derived graph pooling each layer as it is made), by hand:
    blocks of 64 rows past SLICE_FROM under auto and the whole square up to it, always blocks where asked, the
    whole square where asked; the costliest text up to the longest, and the longest that fits."""
    from layerscope.engines.memory import longest_that_fits, shape_planned
    from layerscope.engines.registry import resolve_engine
    from layerscope.engines.torch import SLICE_FROM
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(str(tiny_export("qwen3", pooled=["mean"])))

    def planned(asked=None, *, tokens=False):
        return shape_planned(handle, resolve_engine("ort", asked or {}), depth=None if tokens else 1, tokens=tokens,
                             max_seq=32768, pooled_only=not tokens)

    auto, whole, blocked = planned(), planned({"attention": "whole"}), planned({"attention": "blocked"})
    assert auto.cost(2000).bytes == _qwen3_floor(2000, rows=64, layers_alive=1) \
        == (2 * 4 * 2000 * 64 + 5 * 2000 * 32) * 4
    assert auto.cost(SLICE_FROM).bytes == _qwen3_floor(SLICE_FROM, rows=None, layers_alive=1)
    assert whole.cost(2000).bytes == _qwen3_floor(2000, rows=None, layers_alive=1)
    assert blocked.cost(2000).bytes == auto.cost(2000).bytes and blocked.cost(40).bytes == _qwen3_floor(
        40, rows=None, layers_alive=1)  # a text within one block holds its whole square
    assert blocked.cost(SLICE_FROM).bytes == _qwen3_floor(SLICE_FROM, rows=64, layers_alive=1)
    # token states fetched: raw and layers 0..2 alive at once
    assert planned(tokens=True).cost(2000).bytes == _qwen3_floor(2000, rows=64, layers_alive=4)
    # a run whose longest text has 2,000 tokens may hold one of 1,024 computed whole: the costliest
    at_slice = (2 * 4 * 1024 * 1024 + 5 * 1024 * 32) * 4
    assert auto.peak(2000).bytes == at_slice and auto.peak(2000).tokens == SLICE_FROM
    assert blocked.peak(2000).tokens == 2000 and whole.peak(2000).tokens == 2000
    # every text up to T fits a budget of exactly that: past 1,024, blocks of 2688 bytes a token (4 * (8 * 64 + 160))
    assert longest_that_fits(at_slice, **auto.args()) == at_slice // 2688 == 12726
    assert longest_that_fits(at_slice - 1, **auto.args()) == 1023  # the 1,024-token text's square does not fit
    # a variant whose attention is one fused node has no pattern to run in blocks: its whole square is charged
    assert planned({"variant": "gqa"}).cost(2000).bytes == _qwen3_floor(2000, rows=None, layers_alive=1)


def test_a_shard_plan_of_blocks_fits_without_counting_tokens(tiny_export, tmp_path, monkeypatch):
    """--shard and Ray charge ort what it will run: on the tiny Qwen3 (limit 128 tokens, SLICE_FROM lowered to
    64), pooled vectors of layers 0..1 only, the costliest text up to 128 tokens is one of 128 in blocks of 64 rows with one
    layer's states; memory of exactly that passes with no token counted."""
    from layerscope.extraction.prepare import check_ranges_fit, prepare_request
    from layerscope.model.tokenize import Encoder

    monkeypatch.setattr("layerscope.engines.torch.SLICE_FROM", 64)
    qwen3 = tiny_export("qwen3", pooled=["mean"])
    req = ExtractionRequest.of(qwen3, TEXTS, tmp_path / "s", engine="ort", layers=LAYERS, poolings=["mean"])
    ex = prepare_request(req)
    assert ex.max_length == 128
    need = max(_qwen3_floor(128, rows=64, layers_alive=1), _qwen3_floor(64, rows=None, layers_alive=1))
    assert need == (2 * 4 * 128 * 64 + 5 * 128 * 32) * 4
    monkeypatch.setattr(Encoder, "token_lengths", lambda *a: pytest.fail("tokenized for nothing"))
    check_ranges_fit(ex, ex.choice, [object()], available=need)  # the ranges are never read
    from layerscope.engines.memory import fits, shape_planned
    from layerscope.extraction.engine_plan import engine_options

    plan = engine_options(ex.spec, ex.manifest)
    shape = shape_planned(ex.handle, ex.choice, depth=plan.depth, tokens=False, max_seq=plan.max_seq,
                          pooled_only=plan.pooled_only)
    assert plan.pooled_only and not fits(shape, 128, available=need - 1)
