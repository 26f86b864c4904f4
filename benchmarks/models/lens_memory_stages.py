"""Peak RSS of ``run lens --engine ort`` by stage, in this process (Linux): each stage's peak from VmHWM,
reset before it (``/proc/self/clear_refs``). Usage, from the repository root:

    PYTHONPATH=src python benchmarks/models/lens_memory_stages.py HEAD_MACS EXPORT TEXTS OUT_DIR

``HEAD_MACS``: the head's work bound per run (2**36 is the default). Prints ``STAGE name: rss before, peak
during, after`` (MiB) per call and ``PEAK_MIB`` at the end. Figures in README.md (the second day).
"""
import sys, os, functools
import layerscope.decoding.lens_onnx as lo
import layerscope.decoding.heads as heads
import layerscope.engines.ort_session as ors
macs = int(sys.argv[1]); lo.HEAD_MACS = macs
def rss():
    d = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM")))
    return {k: int(v.split()[0]) // 1024 for k, v in d.items()}
def reset(): open("/proc/self/clear_refs", "w").write("5")
def stage(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        reset(); before = rss()["VmRSS"]
        out = f(*a, **k)
        r = rss(); print(f"STAGE {name}: rss before {before} MiB, peak during {r['VmHWM']} MiB, after {r['VmRSS']} MiB", flush=True)
        return out
    return g
heads.load_decoding_model = stage("load_decoding_model", heads.load_decoding_model)
lo.lens_parity = stage("lens_parity", lo.lens_parity)
lo._trace_head = stage("trace_head", lo._trace_head)
ors.make_session = stage("make_session", ors.make_session)
lo.onnx_lens = stage("onnx_lens(batch)", lo.onnx_lens)
from layerscope.analyses.base import RunRequest, run_analysis
run_analysis("lens", RunRequest(models=[sys.argv[2]], engine="ort", data=sys.argv[3], cache=False, out=sys.argv[4],
                                options={"top_k": 5, "show": 0, "batch": 32}))
import resource; print("PEAK_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
