"""Bench rows on a GPU, on a machine without one: the GPU's peak from faked device queries against hand-worked
figures, the peak each row is a fraction of, peak GPU memory and parallel tokenizing recorded per row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")


def _fake_gpu(monkeypatch, *, major, minor, sms, clock_khz=None, nvml_mhz=None):
    props = SimpleNamespace(name=f"Fake sm_{major}{minor}", major=major, minor=minor, multi_processor_count=sms)
    if clock_khz is not None:
        props.clock_rate = clock_khz
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=0: props)
    if nvml_mhz is None:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    else:
        monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(
            NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
            nvmlDeviceGetMaxClockInfo=lambda h, clock: nvml_mhz if clock == 1 else 0))


def test_h100_peak_by_hand(monkeypatch):
    from layerscope.bench.gpu_peak import gpu_peak

    _fake_gpu(monkeypatch, major=9, minor=0, sms=132, clock_khz=1_980_000)
    fp16 = gpu_peak("fp16")
    # 132 SMs x 1,980 MHz x 4096 FLOP/clock/SM = 1,070,530,560 MFLOP/s
    assert fp16.tflops == pytest.approx(1070.53056) and fp16.clock_source.startswith("torch")
    assert gpu_peak("bf16").tflops == pytest.approx(1070.53056)
    # 132 x 1,980 MHz x 256 = 66,908,160 MFLOP/s
    fp32 = gpu_peak("fp32 (O3: GELU approximated)")
    assert fp32.tflops == pytest.approx(66.90816) and "fp32 CUDA cores" in fp32.text
    assert "x 1,980 MHz (torch device properties clock_rate) x 4096 FLOP/clock/SM" in fp16.text
    assert fp16.text.endswith("= 1,070.5 TFLOP/s fp16")
    unknown = gpu_peak("int8")
    assert unknown.tflops is None and "peak unknown" in unknown.text


def test_a100_peak_from_nvml_by_hand(monkeypatch):
    from layerscope.bench.gpu_peak import gpu_peak

    _fake_gpu(monkeypatch, major=8, minor=0, sms=108, clock_khz=1_000_000, nvml_mhz=1410)
    fp16 = gpu_peak("fp16")
    # NVML's clock wins over clock_rate: 108 x 1,410 MHz x 2048 = 311,869,440 MFLOP/s (A100: 312 published)
    assert fp16.tflops == pytest.approx(311.86944) and fp16.clock_source == "NVML max SM clock"
    # 108 x 1,410 x 128 = 19,491,840 MFLOP/s (A100: 19.5 published)
    assert gpu_peak("fp32").tflops == pytest.approx(19.49184)


def test_peak_unknown_without_a_clock_or_a_known_capability(monkeypatch):
    from layerscope.bench.gpu_peak import gpu_peak

    _fake_gpu(monkeypatch, major=9, minor=0, sms=132)
    p = gpu_peak("fp16")
    assert p.tflops is None and "peak unknown" in p.text and "clock_rate" in p.text
    _fake_gpu(monkeypatch, major=8, minor=9, sms=128, clock_khz=2_520_000)
    p = gpu_peak("fp16")
    assert p.tflops is None and "sm_89" in p.text


def test_each_row_is_a_fraction_of_its_own_peak():
    from layerscope.bench.isolated import _finish
    from layerscope.bench.isolated_report import _gpu_mib, _tokenizer

    cpu_peak = {"gflops": 100.0, "text": "2 cores x 3.12 GHz x 16 = 100 GFLOP/s"}
    flops = 2.0e12  # per pass
    gpu = {"engine": "cuda-fp16", "available": True, "layers": [], "best_s": 0.004, "device": "cuda",
           "gpu_peak": {"tflops": 989.42976, "precision": "fp16", "text": "H100 ... = 989.4 TFLOP/s fp16"}}
    cpu = {"engine": "ort", "available": True, "layers": [], "best_s": 40.0, "device": "cpu"}
    blind = {"engine": "cuda-int8", "available": True, "layers": [], "best_s": 0.01, "device": "cuda:1",
             "gpu_peak": {"tflops": None, "precision": "int8", "text": "peak unknown"}}
    for r in (gpu, cpu, blind):
        _finish(r, None, [], None, flops, cpu_peak)
    # 2e12 FLOP / 0.004 s = 500 TFLOP/s of 989.43: 50.53%; 2e12 / 40 s = 50 GFLOP/s of 100: 50%
    assert gpu["peak_fraction"] == pytest.approx(500 / 989.42976) and gpu["peak_label"] == "GPU fp16"
    assert cpu["peak_fraction"] == pytest.approx(0.5) and cpu["peak_label"] == "CPU fp32"
    assert "peak_fraction" not in blind and blind["peak_label"] == "GPU: unknown"
    assert _gpu_mib({"peak_mib": 1234.4, "source": "torch.cuda.max_memory_allocated"}) == "1,234 (torch)"
    assert _gpu_mib({"peak_mib": None, "source": "not measured (...)"}) == "not measured"
    assert _gpu_mib(None) == "-"
    assert _tokenizer("parallel (tokenizers thread pool ...)") == "parallel" and _tokenizer("one thread (...)") == "1 thread"


class _Row:
    def __init__(self, device, allocator, seen):
        self.layers, self.split, self.own = ["0"], None, None  # no embedding of its own beside the layers
        self.info = {"provider": "fake", "precision": "fp16", "notes": [], "device": device, "allocator": allocator}
        self.seen = seen

    def encode(self, texts):
        import numpy as np

        self.seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
        return np.zeros((1, len(texts), 4), np.float32)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_worker_records_gpu_peak_memory_and_tokenizing(device, monkeypatch, tmp_path):
    from layerscope.bench import worker

    _fake_gpu(monkeypatch, major=9, minor=0, sms=132, clock_khz=1_830_000)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**20)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # as the bench starts every row's process
    seen: list = []
    monkeypatch.setitem(worker.RUNNERS, "fake", lambda job: _Row(device, "torch", seen))
    (tmp_path / "texts.json").write_text(json.dumps(["a", "b", "c"]))
    job = {"name": "torch-fp16", "kind": "fake", "row_kind": "engine", "out_dir": str(tmp_path),
           "texts_file": str(tmp_path / "texts.json"), "passes": 2, "n_acc": 3}
    res = worker.run_job(job)
    if device == "cuda":
        assert seen == ["true"] * 3  # warm-up and both timed passes tokenized in parallel
        assert res["tokenization"].startswith("parallel")
        # 132 x 1,830 MHz x 4096 = 989,429,760 MFLOP/s, the H100 SXM's published dense fp16 figure
        assert res["gpu_peak"]["tflops"] == pytest.approx(989.42976)
        assert res["gpu_memory"] == {"peak_mib": 3.0, "source": "torch.cuda.max_memory_allocated"}
    else:
        assert seen == ["false"] * 3 and res["tokenization"].startswith("one thread")
        assert "gpu_peak" not in res and "gpu_memory" not in res


def test_an_onnx_runtime_gpu_row_without_nvml_says_not_measured(monkeypatch):
    from layerscope.bench import machine
    from layerscope.bench.gpu_peak import GpuMemory

    monkeypatch.setattr(machine, "_gpu_reader", lambda: None)
    with GpuMemory("nvml") as mem:
        pass
    assert mem.result()["peak_mib"] is None and mem.result()["source"].startswith("not measured")
    monkeypatch.setattr(machine, "_gpu_reader", lambda: (lambda: 5 * 2**20))
    with GpuMemory("nvml") as mem:
        pass
    assert mem.result()["peak_mib"] == 5.0 and "NVML" in mem.result()["source"]


def test_the_tokenizers_library_reads_the_switch_at_each_call():
    """What lets a GPU row's process turn on parallel tokenizing after the bench started it with it off."""
    pytest.importorskip("tokenizers")
    code = textwrap.dedent("""
        import os
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from tokenizers import Tokenizer, models, pre_tokenizers
        tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        threads = lambda: len(os.listdir("/proc/self/task"))
        tok.encode_batch(["a a"] * 4000)
        off = threads()
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        tok.encode_batch(["a a"] * 4000)
        print(off, threads())
    """)
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts threads through /proc")
    off, on = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.split())
    assert on > off
