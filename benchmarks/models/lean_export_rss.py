"""Peak memory of an external-data export: the ordinary path (torch.onnx holds a copy of the weights)
vs the streamed one (traced without weights, each written from the model's tensor; export/lean.py).

    /usr/bin/time -v python benchmarks/models/lean_export_rss.py CHECKPOINT OUT_DIR --path old|new|default

``old``/``new``: the external-data path is forced (threshold 1 byte) so a small shape such as bert-base
takes it, traced in this process. ``default``: the exporter's own thresholds, as a user's export runs
(streamed and traced in a child process from ``lean.STREAM_BYTES`` on).
Prints one JSON line: the peak RSS when the graph and its weights were on disk (before the parity
check, which loads the torch reference again), the manifest's ``export_peak_rss_bytes`` (the whole
export), seconds, and the load average.  Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--path", choices=("old", "new", "default"), required=True)
    args = ap.parse_args()

    from layerscope.export import exporter, lean
    from layerscope.model.source import resolve_source

    if args.path != "default":
        exporter.EXTERNAL_DATA_BYTES = 1  # every export takes the external-data path
        lean.ENABLED = args.path == "new"
    marks: dict[str, int] = {}
    real_post = exporter._postprocess

    def postprocess(*a, **k):  # runs right after the graph and weights are written
        marks["peak_rss_through_export_step_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return real_post(*a, **k)

    exporter._postprocess = postprocess
    load_before = open("/proc/loadavg").read().split()[:3]
    t0 = time.perf_counter()
    manifest = exporter.export_model(resolve_source(args.checkpoint), args.out, pooled=["mean"], force=True)
    print(json.dumps({
        "path": args.path, "stream_bytes": lean.STREAM_BYTES, "checkpoint": args.checkpoint, "external_data": manifest.external_data,
        "onnx_bytes": manifest.to_dict()["onnx_bytes"], "seconds": round(time.perf_counter() - t0, 1),
        **marks, "export_peak_rss_bytes": manifest.to_dict()["export_peak_rss_bytes"],
        "parity_worst_max_abs": max(s.max_abs for s in manifest.parity.outputs.values()),
        "loadavg_before": load_before, "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "pid": os.getpid(),
    }))


if __name__ == "__main__":
    main()
