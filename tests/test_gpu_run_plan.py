"""What the GPU run's plan leans on, checked on the CPU: ONNX Runtime GPU's CUDA library cut to one architecture's
kernels (benchmarks/gpu/fatbin.py) on a hand-built ELF file, and the bench's CPU reference over the first N texts
of a long GPU corpus with each row's result on disk as it finishes."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "fatbin.py"


@pytest.fixture(scope="module")
def fatbin():
    spec = importlib.util.spec_from_file_location("gpu_fatbin", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def _entry(arch: int, payload: bytes, kind: int = 2) -> bytes:
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def _fat(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(fatbins: bytes) -> bytes:
    """A 64-bit little-endian ELF file whose only sections are ``.nv_fatbin`` (``fatbins``) and the names."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fat_at = 64
    names_at = fat_at + len(fatbins)
    shoff = (names_at + len(names) + 7) & ~7
    head = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    head += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
    body = head + fatbins + names
    body += bytes(shoff - len(body))
    sec = bytes(64)  # the null section
    sec += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, fat_at, len(fatbins), 0, 0, 8, 0)
    sec += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)
    return body + sec


def test_keep_one_architecture_by_hand(fatbin, tmp_path):
    sm80, sm90, sm120 = _entry(80, b"A" * 24), _entry(90, b"B" * 40), _entry(120, b"C" * 16)
    first = _fat(sm80, sm90, sm120)
    second = _fat(_entry(120, b"D" * 8))  # no sm_90 kernel: left as it is
    lib = _elf(first + second)
    assert fatbin.summary(lib) == {("cubin", 80): (1, 88), ("cubin", 90): (1, 104), ("cubin", 120): (2, 80 + 72)}
    slim, cut, freed = fatbin.keep(lib, 90)
    assert (cut, freed) == (1, 88 + 80) and len(slim) == len(lib)
    at = 64  # .nv_fatbin's offset: the first fat binary keeps its place, now sm_90's entry alone
    assert slim[at:at + 16] == struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(sm90))
    assert slim[at + 16:at + 16 + len(sm90)] == sm90
    assert slim[at + 16 + len(sm90):at + len(first)] == bytes(freed)
    assert slim[at + len(first):at + len(first) + len(second)] == second  # the next one where it was
    assert fatbin.summary(slim) == {("cubin", 90): (1, 104), ("cubin", 120): (1, 72)}
    path = tmp_path / "lib.so"
    path.write_bytes(lib)
    with pytest.raises(SystemExit, match="no sm_75 kernels"):
        fatbin.main(["keep", str(path), "--arch", "75", "--out", str(tmp_path / "none.so")])


def test_a_layout_it_does_not_know_is_refused(fatbin):
    bad = bytearray(_fat(_entry(90, b"B" * 40)))
    struct.pack_into("<Q", bad, 8, 50)  # the header says the entries end inside the first one
    with pytest.raises(SystemExit, match="runs past its size"):
        fatbin.fat_binaries(_elf(bytes(bad)))
    with pytest.raises(SystemExit, match="not a 64-bit little-endian ELF"):
        fatbin.fat_binaries(b"#!/bin/sh\n" + bytes(64))


def test_the_cpu_reference_runs_over_the_first_n_texts_and_rows_land_as_they_finish(bert_export, monkeypatch,
                                                                                     tmp_path):
    from layerscope.bench import isolated
    from layerscope.errors import InputError

    seen = {}

    def fake_worker(job, work, timeout_s):
        seen[job["name"]] = (json.loads(Path(job["texts_file"]).read_text()), job["n_acc"])
        return {"engine": job["name"], "kind": job["row_kind"], "available": False, "reason": "not run in this test"}

    monkeypatch.setattr(isolated, "_run_worker", fake_worker)
    texts = [f"text number {i}" for i in range(10)]
    cfg = isolated.IsolatedConfig(model=str(bert_export), engines=["ort"], texts=texts, corpus="t", rounds=1,
                                  passes=1, reference_texts=3, rows_dir=tmp_path / "rows")
    bench = isolated.run_isolated(cfg)
    assert seen["hf-eager"] == (texts[:3], 3) and seen["ort"] == (texts, 3)
    # each row's result on disk as it finished
    assert sorted(p.name for p in (tmp_path / "rows").iterdir()) == ["r0-hf-eager.json", "r0-ort.json"]
    assert json.loads((tmp_path / "rows" / "r0-ort.json").read_text())["reason"] == "not run in this test"
    assert bench["settings"]["reference_texts"] == 3 and bench["settings"]["accuracy_rows"] == 3
    assert "the first 3 texts" in bench["results"][0]["note"]
    with pytest.raises(InputError, match="--reference-texts must be at least 1"):
        isolated.run_isolated(isolated.IsolatedConfig(model=str(bert_export), engines=["ort"], texts=texts,
                                                      corpus="t", reference_texts=0))
