"""The token writers of text and image stores, and the run that drives them: a text batch is checked once,
before the engine runs it; each layer is held as the store keeps it from the moment the engine hands it over
(real tokens only, storage type), and ``write`` puts what ``keep`` made into the batch's rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from layerscope.errors import StoreError
from layerscope.store.token_store import TextTokenWriter, create_token_arrays

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today", "",
         "the dog and the cat and the fox"]


def test_a_text_batch_is_checked_once_before_the_engine_runs_it(tiny_model, tmp_path, monkeypatch):
    """Catches: the spool check run again when the batch is written (twice per batch), or after the forward."""
    from layerscope.engines.torch import TorchEngine
    from layerscope.extraction.pipeline import extract

    events: list[str] = []
    real_check, real_run = TextTokenWriter.check, TorchEngine.run_keeping_tokens
    monkeypatch.setattr(TextTokenWriter, "check", lambda self, batch: (events.append("check"),
                                                                        real_check(self, batch))[1])
    monkeypatch.setattr(TorchEngine, "run_keeping_tokens",
                        lambda self, *a, **k: (events.append("run"), real_run(self, *a, **k))[1])
    extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="0", tokens=True, batch_tokens=16)
    batches = events.count("run")
    assert batches > 1 and events == ["check", "run"] * batches, events


def test_a_text_unlike_its_spooled_count_is_refused_before_the_engine_runs(tiny_model, tmp_path, monkeypatch):
    """A text whose batch holds another token count than the spool counted (offsets say one token more for
    text 0) is one line naming it, and the engine never runs. Catches: a text run that no longer checks."""
    from transformers import AutoTokenizer

    from layerscope.engines.torch import TorchEngine
    from layerscope.extraction.pipeline import extract

    model = tiny_model("bert")
    n = len(AutoTokenizer.from_pretrained(str(model))(TEXTS[0])["input_ids"])  # with CLS and SEP
    real_init = TextTokenWriter.__init__

    def one_more_for_text_0(self, root, section):
        real_init(self, root, section)
        self.offsets = self.offsets + np.r_[0, np.ones(len(self.offsets) - 1, np.int64)]

    ran: list[int] = []
    monkeypatch.setattr(TextTokenWriter, "__init__", one_more_for_text_0)
    monkeypatch.setattr(TorchEngine, "run_keeping_tokens", lambda self, *a, **k: ran.append(1))
    with pytest.raises(StoreError, match=rf"text 0 has {n} tokens in its batch, {n + 1} were counted when the "
                                         r"corpus was spooled; re-run with --force"):
        extract(model, TEXTS[:1], tmp_path / "s", engine="torch", layers="0", tokens=True)
    assert ran == []


def _batch(index, mask, ids, special, spans):
    return SimpleNamespace(index=np.asarray(index), mask=np.asarray(mask), input_ids=np.asarray(ids),
                           special=np.asarray(special, np.uint8), spans=np.asarray(spans, np.int32))


def test_the_text_writer_writes_what_keep_made_into_each_text_s_range(tmp_path):
    """Two texts of 3 and 1 tokens, batched in the other order with padding; the rows each lands in are worked
    out by hand from the offsets (text 0: rows 0-2, text 1: row 3). Catches: padding kept, a text written
    into another's range, ``keep`` handing over float32 where the store holds float16."""
    section = create_token_arrays(tmp_path, np.array([3, 1]), 8, ["0"], 2, "float16")
    writer = TextTokenWriter(tmp_path, section)
    mask = [[1, 0, 0], [1, 1, 1]]  # text 1 (one token, two pads), then text 0
    batch = _batch([1, 0], mask, [[7, 0, 0], [4, 5, 6]], [[1, 1, 1], [1, 0, 1]],
                   [[[0, 0]] * 3, [[0, 0], [0, 2], [0, 0]]])
    states = np.arange(18, dtype=np.float32).reshape(2, 3, 3)[..., :2] + 0.25  # [batch, seq, hidden]
    kept = writer.keep(batch, "0", states)
    assert kept.dtype == np.float16 and kept.shape == (4, 2)  # the four real tokens, none of the pads
    writer.write(batch, [kept])
    writer.close()
    got = np.load(tmp_path / "tokens" / "0.npy")
    by_hand = np.array([[9.25, 10.25], [12.25, 13.25], [15.25, 16.25], [0.25, 1.25]], np.float16)
    np.testing.assert_array_equal(got, by_hand)
    assert np.load(tmp_path / "tokens" / "ids.npy").tolist() == [4, 5, 6, 7]
    assert np.load(tmp_path / "tokens" / "special.npy").tolist() == [1, 0, 1, 1]
    assert np.load(tmp_path / "tokens" / "spans.npy").tolist() == [[0, 0], [0, 2], [0, 0], [0, 0]]


def test_the_image_writer_keeps_each_layer_encoded_and_refuses_another_token_count(tmp_path):
    """Three images of 4 tokens; a batch of images 2 and 0 lands in rows 8-11 and 0-3 (by hand), image 1's rows
    untouched. Catches: ``keep`` holding the engine's float32 states until the write, tokens of one image
    written into another's rows, a token count unlike the export's accepted."""
    from layerscope.extraction.image_tokens import ImageTokenWriter

    section = create_token_arrays(tmp_path, np.full(3, 4), 4, ["0", "1"], 2, "float16")
    writer = ImageTokenWriter(tmp_path, section, per_image=4)
    batch = SimpleNamespace(index=np.array([2, 0]))
    states = np.random.default_rng(0).standard_normal((2, 4, 2)).astype(np.float32)
    kept = [writer.keep(batch, layer, states + i) for i, layer in enumerate(section.layers)]
    assert [(k.dtype, k.shape) for k in kept] == [(np.dtype(np.float16), (8, 2))] * 2
    writer.write(batch, kept)
    writer.close()
    got = np.load(tmp_path / "tokens" / "1.npy")
    np.testing.assert_array_equal(got[8:12], (states[0] + 1).astype(np.float16))
    np.testing.assert_array_equal(got[0:4], (states[1] + 1).astype(np.float16))
    assert not got[4:8].any()
    with pytest.raises(StoreError, match="the engine gave 5 tokens per image at layer 0, the export records 4"):
        writer.keep(batch, "0", np.zeros((2, 5, 2), np.float32))
