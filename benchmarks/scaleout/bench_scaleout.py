"""Scale-out of extraction: a plain run against 1, 2 and 4 ``--shard`` processes and Ray ``local`` workers.

    python benchmarks/scaleout/bench_scaleout.py real   # MiniLM (ort) over the STS test sentences
    python benchmarks/scaleout/bench_scaleout.py fake   # the test-only fake engine, wide rows: the write ceiling
    python benchmarks/scaleout/bench_scaleout.py merge  # storage alone: the removed driver merge against the
                                                        # new direct writes of 1, 2, 4 processes

Each row prints wall seconds, texts/s, MB/s of vectors written, and the CPU seconds of the coordinating
process (plain: the run itself; Ray: the driver; --shard: none, each shard coordinates itself) with its
share of the wall time. ``uptime`` is printed beside every row: on a shared machine the figures move
with its load.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
STS = Path(os.environ.get("LAYERSCOPE_STS_DIR", ROOT.parent / "shared" / "data" / "stsbenchmark"))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average: ")[-1]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(TESTS)]), "HF_HUB_OFFLINE": "1"}


def sts_corpus(dst: Path) -> int:
    lines = []
    with open(STS / "sts-test.csv", encoding="utf-8", newline="") as fh:
        for line in fh:
            cols = line.rstrip("\r\n").split("\t")
            lines += [cols[5], cols[6]]
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def synthetic_corpus(dst: Path, n: int) -> int:
    import numpy as np

    words = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
    rng = np.random.default_rng(0)
    dst.write_text("\n".join(" ".join(rng.choice(words, size=int(rng.integers(4, 24)))) for _ in range(n)) + "\n")
    return n


def row(label: str, n: int, wall: float, nbytes: int, coord_cpu: float | None) -> dict:
    rec = {"mode": label, "texts": n, "wall_s": round(wall, 2), "texts_per_s": round(n / wall, 1),
           "MB_per_s": round(nbytes / wall / 1e6, 1),
           "coordinator_cpu_s": None if coord_cpu is None else round(coord_cpu, 2),
           "coordinator_share": None if coord_cpu is None else round(coord_cpu / wall, 2), "load": uptime()}
    print(json.dumps(rec), flush=True)
    return rec


def store_bytes(out: Path) -> int:
    meta = json.loads((out / "store.json").read_text())
    item = {"float32": 4, "float16": 2, "bfloat16": 2}[meta["dtype"]]
    return meta["n"] * meta["hidden_size"] * item * len(meta["layers"]) * len(meta["poolings"])


def run_cmd(cmd: list[str]) -> float:
    """CPU seconds of one child process (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, env=env(), stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def shards(cli: list[str], common: list[str], out: Path, count: int) -> float:
    procs = [subprocess.Popen([*cli, *common, "--out", str(out), "--shard", f"{i}/{count}"], env=env(),
                              stdout=subprocess.DEVNULL) for i in range(count)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a shard failed ({p.args})")
    return 0.0


RAY_DRIVER = """
import json, resource, sys, time, ray
import fake_engine
fake_engine.register_fake()  # the driver checks the engine's name
ray.init(num_cpus=int(sys.argv[3]), include_dashboard=False, log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "fake_engine.setup"})
from layerscope.extraction.ray_extract import extract_ray
args = json.loads(sys.argv[1])
t = time.perf_counter()
extract_ray(address="local", workers=int(sys.argv[3]), **args, out=sys.argv[2])
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime}))
"""


def ray_run(args: dict, out: Path, workers: int) -> tuple[float, float]:
    r = subprocess.run([sys.executable, "-c", RAY_DRIVER, json.dumps(args), str(out), str(workers)], check=True,
                       env=env(), capture_output=True, text=True)
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    return rec["wall"], rec["cpu"]


def bench(kind: str) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="scaleout-"))
    rows = []
    try:
        if kind == "real":
            corpus = work / "sts.txt"
            n = sts_corpus(corpus)
            from layerscope.export.exporter import export_model
            from layerscope.model.source import resolve_source

            model = work / "minilm"
            export_model(resolve_source("minilm"), model)
            engine, cli = "ort", [sys.executable, "-m", "layerscope", "-q", "extract"]
            extra = ["--threads", "1"]
        else:
            sys.path.insert(0, str(TESTS))
            from tiny_models import build_tiny_model

            corpus = work / "synthetic.txt"
            n = synthetic_corpus(corpus, int(os.environ.get("SCALEOUT_FAKE_ROWS", "8192")))
            model = build_tiny_model("bert", work / "wide")
            cfg = json.loads((model / "config.json").read_text())
            cfg.update(hidden_size=2048, num_hidden_layers=36)  # a 3B model's row; the fake engine loads no weights
            (model / "config.json").write_text(json.dumps(cfg))
            engine, cli = "fake", [sys.executable, str(TESTS / "fake_engine.py"), "-q", "extract"]
            extra = []
        common = ["--model", str(model), "--input", str(corpus), "--engine", engine, "--layers", "all",
                  "--pooling", "mean", *extra]
        only_ray = os.environ.get("SCALEOUT_ONLY_RAY") == "1"
        out = work / "plain"
        if not only_ray:
            t = time.perf_counter()
            cpu = run_cmd([*cli, *common, "--out", str(out)])
            rows.append(row("plain", n, time.perf_counter() - t, store_bytes(out), cpu))
            shutil.rmtree(out)
        for count in () if only_ray else (1, 2, 4):
            out = work / f"shard{count}"
            t = time.perf_counter()
            shards(cli, common, out, count)
            rows.append(row(f"--shard x/{count}", n, time.perf_counter() - t, store_bytes(out), None))
            shutil.rmtree(out)
        if os.environ.get("SCALEOUT_RAY", "1") == "1":
            args = {"model": str(model), "source": str(corpus), "engine": engine, "layers": "all",
                    "poolings": ["mean"]}
            if kind == "real":
                args["engine_options"] = {"threads": 1}
            for workers in (1, 2, 4):
                out = work / f"ray{workers}"
                t = time.perf_counter()
                wall, cpu = ray_run(args, out, workers)
                rows.append(row(f"ray local x{workers}", n, time.perf_counter() - t, store_bytes(out), cpu))
                shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def old_merge() -> dict:
    """The removed driver merge (shard directories copied into the store), at memory speed, wide rows."""
    import numpy as np

    src = subprocess.run(["git", "show", "6022ce3:src/layerscope/runtime/ray_shards.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    ns: dict = {}
    exec(compile(src, "old_ray_shards.py", "exec"), ns)
    from layerscope.store.store import LayerStore

    work = Path(tempfile.mkdtemp(prefix="merge-"))
    try:
        n, hidden, layers = 2048, 2048, [str(i) for i in range(37)]
        store = LayerStore.create(work, n=n, layers=layers, poolings=["mean"], hidden_size=hidden, dtype="float32",
                                  manifest={"source": {"spec": "bench"}, "family": "bert", "num_layers": 36, "hidden_size": hidden}, settings={})
        lengths = np.lib.format.open_memmap(work / "lengths.npy", mode="w+", dtype=np.int32, shape=(n,))
        rows, timing, total = 512, {}, 0.0
        rng = np.random.default_rng(0)
        for k in range(n // rows):
            d = ns["shard_dir"](work, k)
            d.mkdir(parents=True)
            np.save(d / "mean.npy", rng.standard_normal((len(layers), rows, hidden), dtype=np.float32))
            np.save(d / "lengths.npy", np.ones(rows, np.int32))
            (d / "shard.json").write_text(json.dumps({"start": k * rows, "stop": (k + 1) * rows, "tokens": 0}))
            t = time.perf_counter()
            ns["merge_shard"](store, k, lengths, timing)
            total += time.perf_counter() - t
        nbytes = n * hidden * 4 * len(layers)
        rec = {"mode": "old driver merge (shards -> store)", "MB_per_s": round(nbytes / total / 1e6, 1),
               "seconds": round(total, 2), "bytes": nbytes, "load": uptime()}
        print(json.dumps(rec), flush=True)
        return rec
    finally:
        shutil.rmtree(work, ignore_errors=True)


WRITER = """
import sys, time, numpy as np
from pathlib import Path
from layerscope.store import store_ranges
from layerscope.extraction.range_writer import RangeWriter

store, index, count, rows, hidden, layers = sys.argv[1], *map(int, sys.argv[2:7])

class Eng:  # only what the writer reads when it does not compute
    manifest = __import__("types").SimpleNamespace(hidden_size=hidden)
    preferred_batch_tokens = 1
    def encoder(self, *a):
        return None

w = RangeWriter(store, Eng(), layers=[str(i) for i in range(layers)], poolings=["mean"], store_dtype="float32",
                max_length=8, prompt=None, batch_tokens=None, max_batch=1)
vec = {"mean": np.random.default_rng(index).standard_normal((layers, rows, hidden), dtype=np.float32)}
offsets = np.zeros(10**6, np.int64)
mine = store_ranges.shard_ranges(store_ranges.plan(int(sys.argv[7]), rows, offsets), index, count)
print("ready", flush=True)
while not Path(store, "go").exists():  # every writer starts together
    time.sleep(0.005)
t = time.perf_counter()
for r in mine:
    w.write(r, vec, np.ones(r.rows, np.int32))
    store_ranges.mark_done(Path(store), r.k, {})
print(time.perf_counter() - t)
"""


def new_writes() -> list[dict]:
    """The new path's storage cost alone: N processes pwrite + fsync their ranges of one store (same rows and
    row size as ``old_merge``), no engine."""
    import numpy as np

    from layerscope.store.store import LayerStore

    n, hidden, layers, rows = 2048, 2048, 37, 512
    out = []
    for count in (1, 2, 4):
        work = Path(tempfile.mkdtemp(prefix="writes-"))
        try:
            LayerStore.create(work, n=n, layers=[str(i) for i in range(layers)], poolings=["mean"], hidden_size=hidden,
                              dtype="float32", manifest={"source": {"spec": "bench"}, "family": "bert", "num_layers": 36, "hidden_size": hidden}, settings={})
            np.lib.format.open_memmap(work / "lengths.npy", mode="w+", dtype=np.int32, shape=(n,)).flush()
            procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(work), str(i), str(count), str(rows),
                                       str(hidden), str(layers), str(n)], env=env(), stdout=subprocess.PIPE, text=True)
                     for i in range(count)]
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            (work / "go").touch()
            t = time.perf_counter()
            for p in procs:
                p.communicate()
            wall = time.perf_counter() - t
            nbytes = n * hidden * 4 * layers
            rec = {"mode": f"new direct writes, {count} process(es)", "MB_per_s": round(nbytes / wall / 1e6, 1),
                   "seconds": round(wall, 2), "bytes": nbytes, "load": uptime(),
                   "note": "from a common start signal to the last fsync'd range"}
            print(json.dumps(rec), flush=True)
            out.append(rec)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "real"
    print(json.dumps({"cpu": os.cpu_count(), "load_before": uptime()}))
    if what == "merge":
        old_merge()
        new_writes()
    else:
        bench(what)
