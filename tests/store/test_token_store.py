"""Token-level stores (``extract --tokens``): every token's vector equals a plain Hugging Face forward, with
ids, special mask and character spans as HF's tokenizer gives them; integrity, resume and half-size storage.

The reference never goes through layerscope: transformers' own tokenizer and model, every layer, the batch
padded on the right and on the left (position ids from the mask, as a left-padded decoder needs), and each
text alone without padding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import StoreError
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today",
         "一只猫坐在垫子上", "Water boils at 100 degrees Celsius at sea level.", "",
         "the dog and the cat and the fox"]


def hf_token_states(model_dir: Path, texts: list[str], side: str | None):
    """Per text: (ids, special, offsets, {layer: float64 [tokens, hidden]}) from transformers alone.

    ``side`` None: each text alone; "left"/"right": one padded batch with position ids from the mask."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    net = AutoModel.from_pretrained(str(model_dir)).eval()
    groups = [[t] for t in texts] if side is None else [texts]
    out = []
    for group in groups:
        tok.padding_side = side or "right"
        enc = tok(group, padding=True, return_tensors="pt", return_offsets_mapping=True,
                  return_special_tokens_mask=True)
        offsets, special = enc.pop("offset_mapping"), enc.pop("special_tokens_mask")
        mask = enc["attention_mask"]
        if mask.sum(1).min() == 0:  # an empty text with no special tokens: fed as the EOS token alone
            pytest.skip("tokenizer adds no tokens to an empty text")
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        with torch.no_grad():
            res = net(**enc, position_ids=pos, output_hidden_states=True)
            raw = net.get_input_embeddings()(enc["input_ids"])
        layers = {"raw": raw, **{str(i): h for i, h in enumerate(res.hidden_states)}}
        for b in range(len(group)):
            keep = mask[b].bool()
            out.append((enc["input_ids"][b][keep].numpy(), special[b][keep].numpy(), offsets[b][keep].numpy(),
                        {k: v[b][keep].double().numpy() for k, v in layers.items()}))
    return out


def assert_matches_hf(store: LayerStore, refs, texts: list[str], atol: float) -> None:
    layers = store.token_layers
    first = store.tokens(layers[0])
    assert len(first) == len(texts)
    assert first.total_tokens == sum(len(r[0]) for r in refs)
    for i, (ids, special, offsets, states) in enumerate(refs):
        a, b = first.text_range(i)
        np.testing.assert_array_equal(first.ids[a:b], ids, err_msg=f"ids of text {i}")
        np.testing.assert_array_equal(first.special[a:b], special, err_msg=f"special mask of text {i}")
        real = special == 0
        np.testing.assert_array_equal(first.spans[a:b][real], offsets[real], err_msg=f"spans of text {i}")
        for layer in layers:
            got = store.tokens(layer).text(i)
            assert got.dtype == np.float32 and got.shape == states[layer].shape
            np.testing.assert_allclose(got, states[layer], atol=atol, rtol=0, err_msg=f"text {i} layer {layer}")


@pytest.fixture(scope="module")
def gpt2_export(tiny_export):
    return tiny_export("gpt2")


@pytest.mark.parametrize("side", [None, "right", "left"])
@pytest.mark.parametrize("family,engine", [("bert", "torch"), ("bert", "ort"), ("gpt2", "ort"),
                                           ("qwen2", "torch"), ("bert", "ov")])
def test_token_vectors_equal_a_plain_hf_forward(tiny_model, bert_export, gpt2_export, tmp_path, family, engine,
                                                side):
    if engine == "ov":
        pytest.importorskip("openvino")
    model_dir = tiny_model(family)
    source = {"bert": bert_export, "gpt2": gpt2_export}[family] if engine != "torch" else model_dir
    texts = [t for t in TEXTS if t] if family != "bert" else TEXTS  # GPT-2/Qwen add no token to ""
    report = extract(source, texts, tmp_path / "s", engine=engine, layers="all", poolings=["mean"],
                     tokens=True, batch_tokens=64)
    store = report.store
    refs = hf_token_states(model_dir, texts, side)
    assert_matches_hf(store, refs, texts, atol=2e-4)
    # the pooled rows of the same run are the mean of the stored tokens
    last = store.tokens(-1)
    means = np.stack([last.text(i).mean(0) for i in range(len(texts))])
    np.testing.assert_allclose(store["mean", -1], means, atol=1e-5)


def test_padding_never_reaches_the_store_and_strings_name_the_ids(tiny_model, tmp_path):
    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="0,-1", tokens=True,
                    batch_tokens=64).store
    layer = store.tokens(0)
    assert layer.total_tokens == int(np.diff(layer.offsets).sum())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model("bert")))
    assert tok.pad_token_id not in set(np.asarray(layer.ids).tolist())
    strings = layer.strings()
    assert set(strings) == set(np.asarray(layer.ids).tolist())
    assert all(strings[i] == tok.convert_ids_to_tokens(i) for i in strings)
    # per token id: every occurrence of "the" with its text and position
    the = tok.convert_tokens_to_ids("the")
    vecs, text, pos = layer.of_id(the)
    want = [(i, p) for i in range(len(TEXTS)) for p, t in enumerate(layer.ids[slice(*layer.text_range(i))])
            if t == the]
    assert list(zip(text.tolist(), pos.tolist())) == want and len(want) >= 5
    np.testing.assert_array_equal(vecs[0], layer.text(want[0][0])[want[0][1]])
    n, problems = LayerStore.verify(store.path)
    assert problems == [] and n >= 10


@pytest.mark.parametrize("dtype,bound", [("float16", 2e-3), ("bfloat16", 2e-2)])
def test_half_size_token_store_reads_back_float32_within_its_type(tiny_model, tmp_path, dtype, bound):
    full = extract(tiny_model("bert"), TEXTS, tmp_path / "f", engine="torch", layers="all", tokens=True).store
    half = extract(tiny_model("bert"), TEXTS, tmp_path / "h", engine="torch", layers="all", tokens=True,
                   store_dtype=dtype).store
    assert half.record.token_arrays.dtype == dtype
    size_full = (full.path / "tokens" / "1.npy").stat().st_size
    size_half = (half.path / "tokens" / "1.npy").stat().st_size
    assert size_half < 0.55 * size_full
    a, b = full.tokens(1).rows(), half.tokens(1).rows()
    assert b.dtype == np.float32
    rel = np.abs(a - b).max() / np.abs(a).max()
    assert 0 < rel < bound


def test_flipped_byte_and_cut_token_array_are_caught(tiny_model, tmp_path):
    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="all", tokens=True).store
    path = store.path / "tokens" / "2.npy"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    _, problems = LayerStore.verify(store.path)
    assert any("tokens/2.npy does not match its checksum" in p for p in problems)
    with open(path, "r+b") as fh:
        fh.truncate(len(data) - 64)
    with pytest.raises(StoreError, match="tokens/2.npy"):
        LayerStore.open(store.path)


def test_resume_with_other_token_settings_is_refused_and_force_replaces_a_token_store(tiny_model, tmp_path):
    extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="all", tokens=True)
    with pytest.raises(StoreError, match="tokens="):
        extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="all", resume=True)
    # the token arrays are the store's own: --force replaces the store, and no token file is left behind
    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="all", force=True).store
    assert not (store.path / "tokens").exists() and LayerStore.verify(store.path)[1] == []


def test_pooled_store_has_no_tokens(tiny_model, tmp_path):
    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="all").store
    assert not (store.path / "tokens").exists() and "token_arrays" not in store.meta
    with pytest.raises(StoreError, match="--tokens"):
        store.tokens(1)


KILLED_RUN = """
import sys, time
from layerscope.store import token_store
real = token_store.TextTokenWriter.write
calls = {"n": 0}
def slow(self, batch, states):
    real(self, batch, states)
    calls["n"] += 1
    if calls["n"] >= 6:  # slow from here on: rows get committed (every 2 s) while more are being written
        print("WRITING", flush=True)
        time.sleep(0.2)
token_store.TextTokenWriter.write = slow
from layerscope.extraction.pipeline import extract
extract(sys.argv[1], sys.argv[2], sys.argv[3], engine="ort", layers="all", poolings=["mean"], tokens=True,
        batch_tokens=64)
"""


def test_kill_9_mid_run_resumes_to_a_byte_identical_store(bert_export, tmp_path):
    rng = np.random.default_rng(3)
    words = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words, size=int(rng.integers(1, 30)))) for _ in range(200))
                      + "\n", encoding="utf-8")
    want = extract(bert_export, str(corpus), tmp_path / "want", engine="ort", layers="all", poolings=["mean"],
                   tokens=True, batch_tokens=64).store
    out = tmp_path / "got"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(bert_export), str(corpus), str(out)],
                            stdout=subprocess.PIPE, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if b"WRITING" in line:
            break
    time.sleep(3.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = LayerStore.open(out, allow_incomplete=True)
    done = int(partial.done_mask().sum())
    assert 0 < done < partial.n, done
    partial.close()
    got = extract(bert_export, str(corpus), out, engine="ort", layers="all", poolings=["mean"], tokens=True,
                  batch_tokens=64, resume=True).store
    assert LayerStore.verify(out)[1] == []
    for rel in sorted(want.record.checksums):
        assert (out / rel).read_bytes() == (want.path / rel).read_bytes(), rel
    assert json.loads((out / "store.json").read_text())["token_arrays"] == want.record.token_arrays.to_dict()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_store_tokens_round_trip_through_pyarrow_and_safetensors(tiny_model, tmp_path, dtype):
    import pyarrow.parquet as pq
    from safetensors.numpy import load_file
    from safetensors import safe_open

    from layerscope.store.store_export import export_store

    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="0,2", tokens=True,
                    store_dtype=dtype).store
    table = pq.read_table(str(export_store(store.path, "parquet", tokens=True)))
    layer = store.tokens(2)
    assert table.num_rows == layer.total_tokens
    rows = table.to_pydict()
    # token 4 of text 2, found from its offsets by hand
    start = int(layer.offsets[2])
    k = start + 4
    assert (rows["text"][k], rows["position"][k], rows["id"][k]) == (2, 4, int(layer.ids[k]))
    text = TEXTS[2]
    assert text[rows["start"][k]:rows["end"][k]] in rows["token"][k].lstrip("#")
    np.testing.assert_array_equal(np.asarray(rows["layer_2"], dtype=np.float32), layer.rows())
    np.testing.assert_array_equal(np.asarray(rows["layer_0"], dtype=np.float32), store.tokens(0).rows())
    assert json.loads(table.schema.metadata[b"layerscope"])["dtype"] == dtype

    path = export_store(store.path, "safetensors", tokens=True)
    if dtype == "float32":
        got = load_file(str(path))
        np.testing.assert_array_equal(got["layer_2"], layer.rows())
    with safe_open(str(path), framework="pt") as fh:  # bfloat16 is native to safetensors (torch reads it)
        import torch

        vec = fh.get_tensor("layer_2").to(torch.float32).numpy()
        np.testing.assert_array_equal(vec, layer.rows())
        np.testing.assert_array_equal(fh.get_tensor("offsets").numpy(), layer.offsets)
        np.testing.assert_array_equal(fh.get_tensor("spans").numpy(), layer.spans)
        assert json.loads(fh.get_tensor("text_ids_json").numpy().tobytes()) == store.ids()
        strings = json.loads(fh.get_tensor("strings_json").numpy().tobytes())
        assert strings == {str(k): v for k, v in layer.strings().items()}


def test_cli_extract_tokens_says_its_cost_and_exports(tiny_model, tmp_path, capsys, caplog):
    import logging

    from cli_helpers import run_cli

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "store"
    with caplog.at_level(logging.INFO, logger="layerscope"):
        code, text = run_cli(["extract", "-m", tiny_model("bert"), "-e", "torch", "-i", corpus, "-o", out,
                              "--layers", "0,-1", "--tokens", "--store-dtype", "bfloat16"], capsys)
    assert code == 0, text
    store = LayerStore.open(out)
    total = store.record.token_arrays.total_tokens
    assert f"token store: {total:,} tokens x 2 layers x 32 x 2 bytes" in caplog.text
    assert store.token_layers == ["0", "2"] and store.record.token_arrays.dtype == "bfloat16"
    code, text = run_cli(["export-store", out, "--tokens", "--format", "parquet"], capsys)
    assert code == 0 and (tmp_path / "store.tokens.parquet").is_file(), text
    code, text = run_cli(["extract", "-m", tiny_model("bert"), "-e", "torch", "-i", corpus, "-o", tmp_path / "x",
                          "--tokens", "--store-dtype", "float8"], capsys)
    assert code != 0 and "--store-dtype must be one of float32, float16, bfloat16" in text
    assert not (tmp_path / "x").exists()


def test_ort_fetches_pooled_and_token_outputs_in_one_run(bert_export, tmp_path, monkeypatch):
    """One session.run per batch, and the pooled rows are the graph's own (equal to a pooled-only run)."""
    from layerscope.engines.ort import OrtEngine
    from layerscope.store.token_store import TextTokenWriter

    calls, batches = [], []
    real_run, real_write = OrtEngine._run, TextTokenWriter.write
    monkeypatch.setattr(OrtEngine, "_run", lambda self, batch, names: calls.append(list(names)) or
                        real_run(self, batch, names))
    monkeypatch.setattr(TextTokenWriter, "write", lambda self, batch, states: batches.append(batch.size) or
                        real_write(self, batch, states))
    store = extract(bert_export, TEXTS, tmp_path / "t", engine="ort", layers="all", poolings=["mean", "cls"],
                    tokens=True, batch_tokens=64).store
    assert len(calls) == len(batches) > 1
    assert all(names[:2] == ["pooled.mean", "pooled.cls"] and len(names) == 2 + len(store.layers) for names in calls)
    monkeypatch.setattr(OrtEngine, "_run", real_run)
    plain = extract(bert_export, TEXTS, tmp_path / "p", engine="ort", layers="all", poolings=["mean", "cls"],
                    batch_tokens=64).store
    for p in ("mean", "cls"):
        for layer in store.layers:
            np.testing.assert_array_equal(store[p, layer], plain[p, layer])


def test_token_safetensors_header_does_not_grow_with_the_texts(tiny_model, tmp_path):
    """Ids and token strings are arrays, not header text: the header of 4,000 texts is as small as that of
    a handful (safetensors refuses a header over 100 MB, which per-text header entries reach), and
    safetensors opens the file and gives every id back."""
    import struct

    from safetensors import safe_open

    from layerscope.store.store_export import export_store

    texts = [f"text number {i} about the {['cat', 'dog', 'fox'][i % 3]}" for i in range(4000)]
    store = extract(tiny_model("bert"), texts, tmp_path / "s", engine="torch", layers="2", tokens=True).store
    path = export_store(store.path, "safetensors", tokens=True)
    with open(path, "rb") as fh:
        header_bytes = struct.unpack("<Q", fh.read(8))[0]
    assert header_bytes < 4096, header_bytes  # per-text ids in the header alone would take > 30,000 bytes
    with safe_open(str(path), framework="numpy") as fh:
        assert json.loads(fh.get_tensor("text_ids_json").tobytes()) == store.ids()
        assert fh.get_tensor("layer_2").shape == (store.tokens(2).total_tokens, store.hidden_size)


def test_a_token_safetensors_file_that_does_not_read_back_is_not_called_written(tiny_model, tmp_path, monkeypatch,
                                                                               capsys):
    """A file safetensors cannot open as written (here a writer that mislabels a tensor's type) is one line,
    exit 2, and no file is left at the destination."""
    from cli_helpers import run_cli
    from layerscope.store import token_export

    extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="2", tokens=True)
    monkeypatch.setitem(token_export._ST_DTYPES, "int32", "F32")  # same size, another type: opens, reads wrong
    code, text = run_cli(["export-store", tmp_path / "s", "--tokens", "--format", "safetensors"], capsys)
    assert code == 2 and "cannot be read back" in text and "wrote" not in text, text
    assert not list(tmp_path.glob("s.tokens.safetensors*"))


def _loud_token_model(tiny_model, tmp_path) -> tuple[Path, int]:
    """The tiny BERT with one word's ("dog") input embedding set to 1e5 in every dimension: its raw token vector is
    beyond float16's range (65504) while any text's mean over several tokens stays within it."""
    import shutil

    from safetensors.numpy import load_file, save_file
    from transformers import AutoTokenizer

    out = tmp_path / "loud"
    shutil.copytree(tiny_model("bert"), out)
    word = AutoTokenizer.from_pretrained(str(out)).convert_tokens_to_ids("dog")
    weights = load_file(str(out / "model.safetensors"))
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[key][word] = 1e5
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out, word


def test_a_float16_token_store_never_keeps_inf(tiny_model, tmp_path):
    model, _ = _loud_token_model(tiny_model, tmp_path)
    texts = ["the dog and the cat and the fox ran over the lazy river today", "a dog ran over the river"]
    full = extract(str(model), texts, tmp_path / "f", engine="torch", layers="raw,2", poolings=["mean"],
                   tokens=True).store
    assert float(np.abs(full.tokens("raw").rows()).max()) >= 1e5 > 65504  # the case is what it claims
    assert float(np.abs(full["mean", "raw"]).max()) < 65504
    with pytest.raises(StoreError, match=r"beyond float16's range .*--store-dtype bfloat16"):
        extract(str(model), texts, tmp_path / "h", engine="torch", layers="raw,2", poolings=["mean"], tokens=True,
                store_dtype="float16")
    bf = extract(str(model), texts, tmp_path / "b", engine="torch", layers="raw,2", poolings=["mean"], tokens=True,
                 store_dtype="bfloat16").store
    assert bool(np.isfinite(bf.tokens("raw").rows()).all()) and LayerStore.verify(bf.path)[1] == []


def test_verify_finds_non_finite_token_values(tiny_model, tmp_path):
    """A store whose checksums agree with an inf in a token array (as a writer that kept it would have left
    it) is still not clean."""
    from layerscope.store.store_check import checksums

    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="2", tokens=True,
                    store_dtype="float16").store
    arr = np.load(store.path / "tokens" / "2.npy", mmap_mode="r+")
    arr[3, 0] = np.inf
    arr.flush()
    del arr
    meta = json.loads((store.path / "store.json").read_text())
    meta["checksums"] = {rel: got.to_json() for rel, got in checksums(store.path, meta).items()}
    (store.path / "store.json").write_text(json.dumps(meta))
    _, problems = LayerStore.verify(store.path)
    assert any("tokens/2.npy holds 1 non-finite values" in p for p in problems), problems


def _same_size_garbage(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes((b"{not json" * (size // 9 + 1))[:size])


def _ids_out_of_vocabulary(path: Path) -> None:
    ids = np.load(path, mmap_mode="r+")
    ids[:] = 10 ** 6  # no token has this id: strings.json cannot name it
    ids.flush()


@pytest.mark.parametrize("rel, damage", [("tokens/strings.json", _same_size_garbage),
                                         ("tokens/ids.npy", _ids_out_of_vocabulary)])
@pytest.mark.parametrize("fmt", ["parquet", "safetensors"])
def test_damaged_token_files_that_pass_the_open_checks_are_one_line(rel, damage, fmt, tiny_model, tmp_path, capsys):
    from cli_helpers import run_cli

    store = extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="2", tokens=True).store
    damage(store.path / rel)
    LayerStore.open(store.path)  # sizes and headers are as recorded: open does not see it
    code, text = run_cli(["export-store", store.path, "--tokens", "--format", fmt], capsys)
    if rel.endswith("ids.npy") and fmt == "safetensors":  # ids are copied as they are; verify names them
        assert code == 0, text
    else:
        assert code == 2 and "internal error" not in text and "Traceback" not in text, text
        assert "damaged" in text and ("strings.json" in text), text
    code, text = run_cli(["verify", store.path], capsys)
    assert code != 0 and f"{rel} does not match its checksum" in " ".join(text.split()), text


def test_spans_count_from_the_text_not_from_the_prompt(tiny_model, tmp_path):
    """With --prompt the tokens are the prompt's and then the text's; a text token's span points into the text
    as given (the prompt's characters not counted) and a prompt token has span (0, 0). Checked against the
    tokenizer run on the text alone, and by hand: the text tokens' spans put the text back together."""
    from transformers import AutoTokenizer

    texts = ["a cat sat", "the dog ran home"]
    model = tiny_model("bert")
    store = extract(model, texts, tmp_path / "s", engine="torch", layers="0", tokens=True, prompt="query: ").store
    layer = store.tokens("0")
    tok = AutoTokenizer.from_pretrained(str(model))
    n_prompt = len(tok("query: ", add_special_tokens=False)["input_ids"])
    for i, text in enumerate(texts):
        alone = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        a, b = layer.text_range(i)
        spans = [tuple(s) for s, sp in zip(np.asarray(layer.spans[a:b]).tolist(), np.asarray(layer.special[a:b]))
                 if not sp]
        assert spans == [(0, 0)] * n_prompt + [tuple(o) for o in alone], (text, spans)
        assert "".join(text[x:y] for x, y in spans) == text.replace(" ", "")


def test_token_rows_are_flushed_before_the_store_marks_them_done(tiny_model, tmp_path, monkeypatch):
    """A row is marked done only once all of it is durable: the token arrays are flushed before every commit
    of the pooled store (the commit that writes done.npy)."""
    from layerscope.store.token_store import TokenWriter

    events: list[str] = []
    real_flush, real_commit = TokenWriter.flush, LayerStore.commit
    monkeypatch.setattr(TokenWriter, "flush", lambda self: (events.append("flush tokens"), real_flush(self))[1])
    monkeypatch.setattr(LayerStore, "commit", lambda self, index: (events.append("commit"),
                                                                     real_commit(self, index))[1])
    extract(tiny_model("bert"), TEXTS, tmp_path / "s", engine="torch", layers="0", tokens=True, batch_tokens=32)
    commits = [i for i, e in enumerate(events) if e == "commit"]
    assert commits, events
    for before, at in zip([-1] + commits, commits):
        assert "flush tokens" in events[before + 1:at], events
