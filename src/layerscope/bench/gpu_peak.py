"""A bench row on a GPU: the GPU's compute peak for the row's precision, its peak GPU memory, its tokenizer threads.

Peak = SMs x max SM clock x FLOPs per clock per SM for the precision and compute capability. SMs come from
``torch.cuda.get_device_properties``; the max SM clock from NVML (``pynvml``, the ``nvidia-ml-py`` package)
where it imports, else the device properties' ``clock_rate`` where PyTorch has it, else the peak is unknown
(and said so). FLOPs per clock per SM, dense (no structured sparsity), from NVIDIA's architecture whitepapers:

- sm_70 (Tesla V100 whitepaper): 64 FP32 cores per SM, 2 FLOPs each -> 128 fp32; 8 tensor cores x 64 FP16
  FMA per clock -> 1024 fp16 (no bf16). Check: 80 SMs x 1024 x 1.53 GHz = 125 TFLOP/s, the published figure.
- sm_80 (A100 whitepaper): 64 FP32 cores per SM -> 128 fp32; 4 tensor cores x 256 FP16/BF16 FMA per clock
  -> 2048. Check: 108 x 2048 x 1.41 GHz = 312 TFLOP/s fp16, 108 x 128 x 1.41 GHz = 19.5 TFLOP/s fp32.
- sm_90 (H100 whitepaper): 128 FP32 cores per SM -> 256 fp32; 4 tensor cores, twice A100's FP16/BF16 MMA
  rate per SM per clock -> 4096. Check: H100 SXM5, 132 x 256 x 1.98 GHz = 66.9 TFLOP/s fp32 (published 67);
  132 x 4096 x 1.83 GHz = 989 TFLOP/s dense fp16 (published 989, at a 1,830 MHz boost clock). At NVML's max
  SM clock (1,980 MHz) the fp16 peak is 1,070 TFLOP/s: a fraction of it is about 8% below one of the
  published figure.

fp32 rows are measured against the fp32 peak of the CUDA cores (no TF32: PyTorch leaves TF32 off for matrix
products unless asked; ONNX Runtime's CUDA provider may use TF32 through its ``use_tf32`` option, which can
take such a row past 100%). Other precisions (int8, ...) and other capabilities: peak unknown.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

PER_CLOCK: dict[tuple[int, int], dict[str, int]] = {
    (7, 0): {"fp32": 128, "fp16": 1024},
    (8, 0): {"fp32": 128, "fp16": 2048, "bf16": 2048},
    (9, 0): {"fp32": 256, "fp16": 4096, "bf16": 4096},
}
UNITS = {"fp32": "fp32 CUDA cores", "fp16": "dense fp16 tensor cores", "bf16": "dense bf16 tensor cores"}


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's compute peak for one precision, and how it was worked out (``tflops`` None: unknown)."""

    gpu: str
    capability: str
    sms: int
    precision: str
    mhz: float | None
    clock_source: str
    flops_per_clock_sm: int | None
    tflops: float | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def precision_key(precision: str | None) -> str | None:
    """``fp32``, ``fp16`` or ``bf16`` from a row's precision text (``"fp16"``, ``"fp32 (O3: ...)"``), else None."""
    head = (precision or "").split()[0] if precision else ""
    return head if head in UNITS else None


def max_sm_clock_mhz(device: int, props) -> tuple[float | None, str]:
    """(MHz, where it came from): NVML's max SM clock, else the device properties' ``clock_rate`` (kHz)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        return float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)), "NVML max SM clock"
    except Exception:  # pynvml missing, or no NVML driver: try the next source
        pass
    khz = getattr(props, "clock_rate", None)
    if khz:
        return float(khz) / 1000.0, "torch device properties clock_rate"
    return None, "unknown (no NVML, and this PyTorch reports no clock_rate)"


def gpu_peak(precision: str | None, device: int = 0) -> GpuPeak:
    """The compute peak of CUDA device ``device`` for a row of ``precision``."""
    import torch

    props = torch.cuda.get_device_properties(device)
    cap = (int(props.major), int(props.minor))
    sms = int(props.multi_processor_count)
    mhz, source = max_sm_clock_mhz(device, props)
    key = precision_key(precision)
    per = PER_CLOCK.get(cap, {}).get(key) if key else None
    where = f"{props.name} (sm_{cap[0]}{cap[1]}, {sms} SMs)"
    if per is None:
        why = f"no FLOPs-per-clock figure for {precision or 'this precision'} on sm_{cap[0]}{cap[1]}"
        return GpuPeak(props.name, f"sm_{cap[0]}{cap[1]}", sms, key or str(precision), mhz, source, per, None,
                       f"{where}: peak unknown ({why})")
    if mhz is None:
        return GpuPeak(props.name, f"sm_{cap[0]}{cap[1]}", sms, key, None, source, per, None,
                       f"{where}: peak unknown (max SM clock {source})")
    tflops = sms * mhz * 1e6 * per / 1e12
    return GpuPeak(props.name, f"sm_{cap[0]}{cap[1]}", sms, key, mhz, source, per, tflops,
                   f"{where} x {mhz:,.0f} MHz ({source}) x {per} FLOP/clock/SM ({UNITS[key]}) "
                   f"= {tflops:,.1f} TFLOP/s {key}")


def on_gpu(device: str | None) -> bool:
    return bool(device) and str(device).split(":")[0] == "cuda"


def set_tokenization(device: str | None, processes: int = 1) -> str:
    """How a row tokenizes, for its result: a row on a GPU in ``processes`` tokenizer processes where its engine
    made a pool (extraction/batching.py ``tokenizer_pool``: sized from the host's cores), with the tokenizers
    library's own thread pool on for what this process still tokenizes (read from ``TOKENIZERS_PARALLELISM`` at
    each call: the host cores are free while the GPU runs); a CPU row keeps one thread, its cores run the
    engine (or the processes a measurement recorded on this CPU asks for)."""
    if on_gpu(device):
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        if processes > 1:
            return f"{processes} processes (a tokenizer pool sized from the host's cores: the GPU outruns one)"
        return "parallel (tokenizers thread pool: the host cores are free while the GPU runs)"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if processes > 1:
        return f"{processes} processes (recorded on this CPU: one tokenizer does not keep the engine fed)"
    return "one thread (TOKENIZERS_PARALLELISM=false: the cores run the engine)"


class GpuMemory:
    """Peak GPU memory over the timed passes: ``torch.cuda.max_memory_allocated`` for a row that runs
    PyTorch, else NVML's used memory of the device sampled on a thread (every process's and the CUDA context
    included), else not measured."""

    def __init__(self, allocator: str):
        self.allocator = allocator
        self._nvml = None

    def __enter__(self) -> GpuMemory:
        if self.allocator == "torch":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            from layerscope.bench.machine import PeakMemory

            self._nvml = PeakMemory(gpu=True)
            self._nvml.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._nvml is not None:
            self._nvml.__exit__(*exc)

    def result(self) -> dict[str, Any]:
        if self.allocator == "torch":
            import torch

            torch.cuda.synchronize()
            return {"peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                    "source": "torch.cuda.max_memory_allocated"}
        peak = self._nvml.peak_gpu if self._nvml is not None else None
        if peak is None:
            return {"peak_mib": None, "source": "not measured (NVML not readable: pip install nvidia-ml-py)"}
        return {"peak_mib": peak / 2**20, "source": "NVML used memory of the device, sampled (all processes)"}
