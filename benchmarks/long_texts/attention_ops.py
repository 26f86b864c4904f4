"""Which ONNX Runtime attention op bounds memory on a long causal text: one attention layer at the Qwen3-0.6B shape.

    python benchmarks/long_texts/attention_ops.py [--lengths 2048,4096,8192,16384] [--max-mib MIB]
        [--ops plain,attention23,gqa,mha-causal,mha,loop] [--block-rows 64]
        [--out benchmarks/results/long-texts-qwen3-0.6b/attention-ops.json]

For each length ``T`` the parent draws q ``[1, 16, T, 128]`` and k, v ``[1, 8, T, 128]`` (float32, seeded),
computes the reference with PyTorch's ``scaled_dot_product_attention`` (its flash kernel, ``is_causal``,
key/value heads repeated to the query heads; without ``is_causal`` for the bidirectional row), and runs each
graph below in a fresh process, which reports:

- ``peak_rss_mib``: the process's ``VmHWM`` after one run (inputs, session and output included);
- ``run_peak_mib``: the rise of the peak during the run alone (``VmHWM`` is reset, ``/proc/self/clear_refs`` 5,
  after the inputs are loaded and the session is made, and read after the run less ``VmRSS`` before it): what
  the op itself takes, the figure that grows with ``T^2`` or with ``T``;
- ``run_seconds`` (one run, first run included: take times only on a quiet machine) and ``max_abs_diff`` from the
  reference.

The graphs (all float32, batch 1, one attention layer, no weights):

- ``plain``: what the exported graph computes (transformers' eager attention): the key/value heads repeated to
  the query heads (``Expand``), ``MatMul`` q k^T, scale, an additive causal mask built in the graph, ``Softmax``,
  ``MatMul`` with v;
- ``attention23``: the ONNX opset-23 ``Attention`` op, ``is_causal=1``, 16 query and 8 key/value heads (4D);
- ``gqa``: ``com.microsoft.GroupQueryAttention`` (3D, causal by definition, ``seqlens_k`` T-1);
- ``mha-causal``: ``com.microsoft.MultiHeadAttention`` with ``unidirectional=1`` (no GQA: k and v repeated to 16
  heads before the graph);
- ``mha``: the same op bidirectional (its flash path's case; compared with a non-causal reference: not a causal
  decoder's attention, shown for what the flash path costs);
- ``loop``: the plain computation over blocks of ``--block-rows`` query rows inside an ONNX ``Loop`` (what
  engines/blocked.py makes of each layer): each block's scores are ``heads x rows x K`` with ``K`` the keys up
  to the block's last row (causal); key/value heads read in place by broadcasting (no ``Expand``).

A child whose resident set passes ``--max-mib`` (default: 80% of the memory available at the start) is stopped
and recorded as such; ``plain`` at a length whose two ``16 x T x T`` float tensors alone pass that is not started,
nor an op whose run peak grew faster than ``T^1.5`` over its two lengths before and would pass it.
Records the CPU model and flags and the load average around each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HQ, HKV, D = 16, 8, 128
ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
import numpy as np
model, feeds_json, out_path = sys.argv[1:4]

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
import onnxruntime as ort
feeds = {name: np.load(path) for name, path in json.loads(feeds_json).items()}
opts = ort.SessionOptions()
t0 = time.perf_counter()
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
t2 = time.perf_counter()
y = sess.run(None, feeds)[0]
t3 = time.perf_counter()
run_hwm = status("VmHWM")
np.save(out_path, y)
print(json.dumps({"session_seconds": t1 - t0, "run_seconds": t3 - t2, "rss_before_run_mib": before,
                  "run_peak_mib": run_hwm - before, "peak_rss_mib": max(run_hwm, status("VmHWM")),
                  "output_shape": list(y.shape)}))
"""


# ---- graphs ---------------------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), *, opset=17, ms=False):
    from onnx import helper

    graph = helper.make_graph(nodes, "attention", inputs, outputs, initializer=list(initializers))
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    return helper.make_model(graph, opset_imports=ops, ir_version=11 if opset >= 23 else 8)


def _vi(name, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name, value, dtype="int64"):
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def plain_graph():
    """Eager attention as transformers writes it: repeat_kv, scores, additive causal mask, softmax, values."""
    import numpy as np
    from onnx import helper

    n = helper.make_node
    nodes = [
        # repeat_kv: [1, 8, T, D] -> [1, 8, 2, T, D] -> [1, 16, T, D]
        n("Shape", ["k"], ["kshape"]),
        n("Gather", ["kshape", "i2"], ["t"], axis=0),
        n("Unsqueeze", ["t", "ax0"], ["t1"]),
        n("Unsqueeze", ["k", "ax2"], ["k5"]), n("Unsqueeze", ["v", "ax2"], ["v5"]),
        n("Concat", ["one", "hkv", "groups", "t1", "d"], ["shape5"], axis=0),
        n("Expand", ["k5", "shape5"], ["kx"]), n("Expand", ["v5", "shape5"], ["vx"]),
        n("Concat", ["one", "hq", "t1", "d"], ["shape4"], axis=0),
        n("Reshape", ["kx", "shape4"], ["kr"]), n("Reshape", ["vx", "shape4"], ["vr"]),
        n("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["qk"]),
        n("Mul", ["qk", "scale"], ["scores"]),
        # causal mask [1, 1, T, T]: 0 where key <= query, the float minimum above
        n("Range", ["zero", "t", "one0"], ["pos"]),
        n("Unsqueeze", ["pos", "ax1"], ["rows"]),
        n("Unsqueeze", ["pos", "ax0"], ["cols"]),
        n("Greater", ["cols", "rows"], ["future"]),
        n("Where", ["future", "fmin", "fzero"], ["mask2"]),
        n("Unsqueeze", ["mask2", "ax01"], ["mask"]),
        n("Add", ["scores", "mask"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vr"], ["y"]),
    ]
    inits = [_const("i2", 2), _const("ax2", [2]), _const("ax1", [1]), _const("ax0", [0]), _const("ax01", [0, 1]),
             _const("one", [1]), _const("hkv", [HKV]), _const("groups", [HQ // HKV]), _const("hq", [HQ]),
             _const("d", [D]), _const("zero", 0), _const("one0", 1),
             _const("scale", D ** -0.5, "float32"), _const("fmin", np.finfo(np.float32).min, "float32"),
             _const("fzero", 0.0, "float32")]
    return _model(nodes, [_vi("q", [1, HQ, "T", D]), _vi("k", [1, HKV, "T", D]), _vi("v", [1, HKV, "T", D])],
                  [_vi("y", [1, HQ, "T", D])], inits)


def attention23_graph():
    from onnx import helper

    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)  # 4D: heads read from the shapes
    return _model([node], [_vi("q", [1, HQ, "T", D]), _vi("k", [1, HKV, "T", D]), _vi("v", [1, HKV, "T", D])],
                  [_vi("y", [1, HQ, "T", D])], opset=23)


def gqa_graph():
    from onnx import TensorProto, helper

    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], ["y"],
                            domain="com.microsoft", num_heads=HQ, kv_num_heads=HKV)
    ints = [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    return _model([node], [_vi("q", [1, "T", HQ * D]), _vi("k", [1, "T", HKV * D]), _vi("v", [1, "T", HKV * D])]
                  + ints, [_vi("y", [1, "T", HQ * D])], ms=True)


def mha_graph(causal: bool):
    from onnx import helper

    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=HQ,
                            unidirectional=int(causal))
    return _model([node], [_vi("q", [1, "T", HQ * D]), _vi("k", [1, "T", HQ * D]), _vi("v", [1, "T", HQ * D])],
                  [_vi("y", [1, "T", HQ * D])], ms=True)


def loop_graph(rows: int):
    """Causal GQA attention over blocks of ``rows`` query rows in a Loop: q padded to a whole number of blocks,
    the padding cut from the output."""
    import numpy as np
    from onnx import TensorProto, helper

    n = helper.make_node
    # body: (iteration, cond) -> (cond, block output [HKV, G, rows, D])
    body_nodes = [
        n("Mul", ["i", "c"], ["start"]),
        n("Add", ["start", "c"], ["end"]),
        n("Min", ["end", "t"], ["kend"]),
        n("Unsqueeze", ["start", "ax0"], ["start1"]), n("Unsqueeze", ["end", "ax0"], ["end1"]),
        n("Unsqueeze", ["kend", "ax0"], ["kend1"]),
        n("Slice", ["qg", "start1", "end1", "ax2"], ["qb"]),  # [HKV, G, rows, D]
        n("Slice", ["kg", "zero1", "kend1", "ax2"], ["kb"]),  # [HKV, 1, K, D]
        n("Slice", ["vg", "zero1", "kend1", "ax2"], ["vb"]),
        n("Transpose", ["kb"], ["kbt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["qb", "kbt"], ["qk"]),  # [HKV, G, rows, K]: k broadcast over the group
        n("Mul", ["qk", "scale"], ["scores"]),
        n("Range", ["start", "end", "one0"], ["rows0"]),
        n("Range", ["zero", "kend", "one0"], ["cols0"]),
        n("Unsqueeze", ["rows0", "ax1"], ["rowsu"]),
        n("Unsqueeze", ["cols0", "ax0"], ["cols"]),
        n("Greater", ["cols", "rowsu"], ["future"]),  # [rows, K]
        n("Where", ["future", "fmin", "scores"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vb"], ["yb"]),
        n("Identity", ["cond_in"], ["cond_out"]),
    ]
    body = helper.make_graph(
        body_nodes, "block",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("yb", TensorProto.FLOAT, [HKV, HQ // HKV, rows, D])])
    outer = [
        n("Shape", ["k"], ["kshape"]),
        n("Gather", ["kshape", "i2"], ["t"], axis=0),  # scalar T
        # blocks = ceil(T / rows); q padded to blocks * rows
        n("Add", ["t", "c"], ["tc"]), n("Sub", ["tc", "one0"], ["tc1"]), n("Div", ["tc1", "c"], ["blocks"]),
        n("Mul", ["blocks", "c"], ["tp"]), n("Sub", ["tp", "t"], ["pad"]),
        n("Unsqueeze", ["pad", "ax0"], ["pad1"]),
        n("Concat", ["zeros2", "zeros2", "zeros2", "pad1", "zero1"], ["pads"], axis=0),  # end of axis 2
        n("Pad", ["q", "pads"], ["qp"]),
        # [1, HQ, Tp, D] -> [HKV, G, Tp, D]; k, v [1, HKV, T, D] -> [HKV, 1, T, D]
        n("Reshape", ["qp", "gshape"], ["qg"]),
        n("Reshape", ["k", "kvshape"], ["kg"]), n("Reshape", ["v", "kvshape"], ["vg"]),
        n("Loop", ["blocks", "true"], ["stacked"], body=body),  # [blocks, HKV, G, rows, D]
        n("Transpose", ["stacked"], ["ordered"], perm=[1, 2, 0, 3, 4]),  # [HKV, G, blocks, rows, D]
        n("Reshape", ["ordered", "outshape"], ["ypad"]),  # [1, HQ, Tp, D]
        n("Unsqueeze", ["t", "ax0"], ["t1"]),
        n("Slice", ["ypad", "zero1", "t1", "ax2"], ["y"]),
    ]
    inits = [_const("i2", 2), _const("ax0", [0]), _const("ax1", [1]), _const("ax2", [2]), _const("zero", 0),
             _const("zero1", [0]), _const("zeros2", [0, 0]), _const("one0", 1), _const("c", int(rows)),
             _const("gshape", [HKV, HQ // HKV, -1, D]), _const("kvshape", [HKV, 1, -1, D]),
             _const("outshape", [1, HQ, -1, D]), _const("true", True, "bool"),
             _const("scale", D ** -0.5, "float32"), _const("fmin", np.finfo(np.float32).min, "float32")]
    return _model(outer, [_vi("q", [1, HQ, "T", D]), _vi("k", [1, HKV, "T", D]), _vi("v", [1, HKV, "T", D])],
                  [_vi("y", [1, HQ, "T", D])], inits)


# ---- inputs, reference, runs ----------------------------------------------------------------------------------

def feeds_for(op: str, q, k, v, folder: Path) -> dict[str, str]:
    """The op's inputs written as .npy files in ``folder``: name -> path."""
    import numpy as np

    t = q.shape[2]
    bsh = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(1, t, -1))  # noqa: E731
    if op in ("plain", "attention23", "loop"):
        arrays = {"q": q, "k": k, "v": v}
    elif op == "gqa":
        arrays = {"q": bsh(q), "k": bsh(k), "v": bsh(v), "seqlens_k": np.array([t - 1], dtype=np.int32),
                  "total": np.array(t, dtype=np.int32)}
    else:  # mha: key/value heads repeated to the query heads
        rep = lambda x: np.repeat(x, HQ // HKV, axis=1)  # noqa: E731
        arrays = {"q": bsh(q), "k": bsh(rep(k)), "v": bsh(rep(v))}
    paths = {}
    for name, value in arrays.items():
        paths[name] = str(folder / f"{op}-{name}.npy")
        np.save(paths[name], value)
    return paths


def to_bhsd(op: str, y):
    t = y.shape[1] if y.ndim == 3 else y.shape[2]
    return y if y.ndim == 4 else y.reshape(1, t, HQ, D).transpose(0, 2, 1, 3)


def reference(q, k, v, causal: bool):
    """PyTorch's flash kernel (memory linear in T; refused rather than run whole), key/value heads repeated."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = lambda x: torch.from_numpy(x).repeat_interleave(HQ // HKV, dim=1)  # noqa: E731
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        y = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q), rep(k), rep(v), is_causal=causal)
    return y.numpy()


def graph_for(op: str, block_rows: int):
    return {"plain": plain_graph, "attention23": attention23_graph, "gqa": gqa_graph,
            "mha-causal": lambda: mha_graph(True), "mha": lambda: mha_graph(False),
            "loop": lambda: loop_graph(block_rows)}[op]()


def growth(done: list[dict], t: int) -> tuple[float, float] | None:
    """(exponent, predicted run peak MiB at ``t``) from an op's last two measured lengths, where it grew faster
    than linearly (else None: nothing to fear)."""
    import math

    if len(done) < 2:
        return None
    (t0, m0), (t1, m1) = ((r["tokens"], max(r["run_peak_mib"], 1.0)) for r in done[-2:])
    exponent = math.log(m1 / m0) / math.log(t1 / t0)
    return (exponent, m1 * (t / t1) ** exponent) if exponent > 1.5 else None


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def watch(cmd: list[str], limit_mib: float, timeout: float) -> tuple[subprocess.CompletedProcess | None, str | None]:
    """Run ``cmd``; stop it when its resident set passes ``limit_mib`` or it runs past ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start, seen = time.monotonic(), 0.0
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    seen = max(seen, int(line.split()[1]) / 1024)
        except OSError:
            pass
        why = (f"stopped: resident set passed {limit_mib:,.0f} MiB" if seen > limit_mib else
               f"stopped: ran past {timeout:.0f} s" if time.monotonic() - start > timeout else None)
        if why:
            proc.kill()
            proc.communicate()
            return None, why
        time.sleep(0.02)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,4096,8192,16384")
    ap.add_argument("--ops", default="plain,attention23,gqa,mha-causal,mha,loop")
    ap.add_argument("--block-rows", type=int, default=64, help="the loop graph's query rows per block")
    ap.add_argument("--max-mib", type=float, default=None)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import numpy as np
    import onnx

    sys.path.insert(0, str(ROOT / "src"))
    from layerscope.bench.machine import describe_machine

    limit = args.max_mib or 0.8 * available_mib()
    rows = []
    with tempfile.TemporaryDirectory(prefix="attention-ops-") as tmp:
        folder = Path(tmp)
        ops = args.ops.split(",")
        for op in ops:
            onnx.save(graph_for(op, args.block_rows), str(folder / f"{op}.onnx"))
        for t in (int(x) for x in args.lengths.split(",")):
            rng = np.random.default_rng(t)
            q = rng.standard_normal((1, HQ, t, D), dtype=np.float32)
            k = rng.standard_normal((1, HKV, t, D), dtype=np.float32)
            v = rng.standard_normal((1, HKV, t, D), dtype=np.float32)
            refs = {}
            for op in ops:
                quadratic = 2 * HQ * t * t * 4 / 2 ** 20  # scores and probabilities of one layer, MiB
                row = {"op": op, "tokens": t, "quadratic_mib": round(quadratic)}
                grown = growth([r for r in rows if r["op"] == op and "run_peak_mib" in r], t)
                if op == "plain" and quadratic > limit:
                    row["skipped"] = f"its scores and softmax alone are {quadratic:,.0f} MiB, above {limit:,.0f}"
                elif grown is not None and grown[1] > limit:
                    row["skipped"] = (f"its run peak grew as T^{grown[0]:.2f} over the two lengths before: about "
                                      f"{grown[1]:,.0f} MiB here, above {limit:,.0f}")
                if "skipped" in row:
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                causal = op != "mha"
                if causal not in refs:
                    refs[causal] = reference(q, k, v, causal)
                feeds = feeds_for(op, q, k, v, folder)
                out = folder / f"{op}-y.npy"
                row["load_before"] = os.getloadavg()[0]
                res, stopped = watch([sys.executable, "-c", CHILD, str(folder / f"{op}.onnx"), json.dumps(feeds),
                                      str(out)], limit, args.timeout)
                row["load_after"] = os.getloadavg()[0]
                if stopped:
                    row["stopped"] = stopped
                elif res.returncode != 0:
                    row["failed"] = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1][:400]
                else:
                    row.update(json.loads(res.stdout.strip().splitlines()[-1]))
                    y = to_bhsd(op, np.load(out))
                    row["max_abs_diff"] = float(np.max(np.abs(y - refs[causal])))
                    out.unlink()
                for path in feeds.values():
                    Path(path).unlink()
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "batch": 1, "dtype": "float32"},
              "block_rows": args.block_rows, "memory_limit_mib": round(limit),
              "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "machine": describe_machine(),
              "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
