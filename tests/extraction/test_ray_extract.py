"""Extraction on a local Ray cluster equals a single-process extract: ids, order and every array.

One Ray cluster (2 CPUs) is started per module, so its start-up cost is paid once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from store_checks import assert_same_store

from layerscope.errors import InputError, MissingExtraError
from layerscope.store.store import LayerStore
from layerscope.store.store_record import RangePlan
from hang_guard import HANG_S  # noqa: E402

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 40)))) for _ in range(n)]
    texts[3] = "   "  # whitespace-only and empty rows stay rows
    return texts


def test_missing_ray_is_one_line(monkeypatch):
    from layerscope.extraction.ray_extract import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'layerscope\[ray\]'"):
        require_ray()


def test_cli_ray_errors_are_one_line(monkeypatch, tmp_path, capsys):
    from layerscope.cli import main

    (tmp_path / "c.txt").write_text("a\n", encoding="utf-8")
    base = ["extract", "--input", str(tmp_path / "c.txt"), "--out", str(tmp_path / "store")]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--ray-workers", "3"])
    assert exc.value.code == 2 and "--ray-workers needs --ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit) as exc:
        main([*base, "--ray", "local"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "pip install 'layerscope[ray]'" in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


def test_sources_other_than_files_keep_order_and_empty_rows():
    from layerscope.data.corpus import records_of

    texts = ["a b", "", "  ", "c"]
    for source in (texts, iter(texts)):
        recs = list(records_of(source))
        assert [(r.id, r.text) for r in recs] == [("0", "a b"), ("1", ""), ("2", "  "), ("3", "c")]
    with pytest.raises(InputError, match="no texts"):
        list(records_of(iter([])))
    with pytest.raises(InputError, match="text 1 is a int"):
        list(records_of(["a", 3]))
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"body": texts, "label": [0, 1, 0, 1]})
    assert [r.text for r in records_of(ds, text_field="body")] == texts
    with pytest.raises(InputError, match="no column 'text'"):
        list(records_of(ds))


def test_range_rows_are_granule_multiples():
    from layerscope.store.store_ranges import GRANULE, MAX_RANGE_BYTES, MAX_RANGE_ROWS, range_rows

    assert range_rows(10, 1536) == GRANULE
    assert range_rows(2758 * 64, 1536) == 2816  # 64 ranges of 2,758 rows, rounded up to 256s
    assert range_rows(10**8, 1536) == MAX_RANGE_ROWS
    assert range_rows(10**8, 37 * 2048 * 4) * 37 * 2048 * 4 <= MAX_RANGE_BYTES  # a 3B model's row: held in memory
    for n, b in [(1, 4), (2758, 1536), (100_000, 10**7)]:
        assert range_rows(n, b) % GRANULE == 0


def test_unreachable_cluster_is_one_line_and_reads_nothing(tmp_path):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    if ray.is_initialized():
        pytest.skip("a Ray cluster is already connected in this process")
    from layerscope.extraction.ray_extract import extract_ray

    (tmp_path / "c.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(InputError, match="cannot reach the Ray cluster at '127.0.0.1:9'"):
        extract_ray("no-model-needed", str(tmp_path / "c.txt"), tmp_path / "store", address="127.0.0.1:9")
    assert not (tmp_path / "store").exists()  # the cluster is joined before the corpus is spooled
    assert not ray.is_initialized()


# ---------------------------------------------------------------- on a local cluster

@pytest.fixture(scope="module")
def ray_faults(tmp_path_factory):
    """A folder the cluster's workers watch: a file ``kill-<k>`` there makes the actor that runs range ``k``
    SIGKILL itself once, inside the range (``fake_engine.install_range_faults``, a worker setup hook)."""
    return tmp_path_factory.mktemp("ray-faults")


@pytest.fixture(scope="module")
def ray_cluster(ray_faults):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    import logging
    import os

    import fake_engine

    tests = str(Path(fake_engine.__file__).parent)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests, old) if p)  # the workers import fake_engine
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 runtime_env={"worker_process_setup_hook": "fake_engine.setup",
                              "env_vars": {fake_engine.KILL_DIR: str(ray_faults)}})
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def small_corpus(bert_export, tmp_path_factory):
    """1,100 texts as JSONL with user ids, and the plain single-process store of them."""
    import json

    from layerscope.extraction.pipeline import extract

    root = tmp_path_factory.mktemp("ray-small")
    texts = corpus(1100)
    path = root / "c.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"doc": f"d{i:05d}", "body": t}) + "\n")
    plain = extract(bert_export, str(path), root / "plain", engine="ort", layers="all", poolings=["mean", "cls"],
                    text_field="body", id_field="doc").store
    return path, plain


def _ray_kw():
    return dict(engine="ort", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc",
                workers=2, shard_rows=256)


@pytest.mark.ray
def test_actor_killed_mid_run_gives_the_same_store(ray_cluster, ray_faults, bert_export, small_corpus, tmp_path):
    """An actor killed inside the last range, with ranges of two granules: the range is retried on a restarted
    actor and the store equals the plain run."""
    from layerscope.extraction.ray_extract import extract_ray

    path, plain = small_corpus
    arm, marker = ray_faults / "kill-2", ray_faults / "killed-2"
    arm.write_text("")
    seen: list[dict] = []
    try:
        report = extract_ray(bert_export, str(path), tmp_path / "store", on_shard=seen.append,
                             **{**_ray_kw(), "shard_rows": 512})
    finally:
        arm.unlink()
    assert marker.exists(), "the fault was never injected"
    killed_pid = int(marker.read_text())
    marker.unlink()
    shard2 = [s for s in seen if s["shard"] == 2]
    assert len(shard2) == 1 and shard2[0]["pid"] != killed_pid  # retried on a restarted actor
    assert sorted(s["shard"] for s in seen) == [0, 1, 2]
    assert report.store.record.ranges == RangePlan(rows=512, count=3)
    assert report.n == 1100 and report.empty == plain.empty_texts >= 1
    assert_same_store(plain, LayerStore.open(tmp_path / "store"))
    assert not (tmp_path / "store" / "ranges").exists()  # claims and done marks go once the store is finished


@pytest.mark.ray
def test_driver_killed_mid_run_resumes_without_recomputing(ray_cluster, bert_export, small_corpus, tmp_path):
    from layerscope.extraction.ray_extract import extract_ray

    path, plain = small_corpus

    class DriverDied(Exception):
        pass

    recorded: list[int] = []

    def die_after_two(info):
        recorded.append(info["shard"])  # ranges come back in the order they finish
        if len(recorded) == 2:
            raise DriverDied

    with pytest.raises(DriverDied):
        extract_ray(bert_export, str(path), tmp_path / "store", on_shard=die_after_two, **_ray_kw())
    half = LayerStore.open(tmp_path / "store", allow_incomplete=True)
    merged = int(np.asarray(half.done_mask()).sum())
    assert merged == 512 and not half.complete  # the driver recorded two ranges; the rest is not recorded
    with pytest.raises(Exception, match="already holds a layer store"):
        extract_ray(bert_export, str(path), tmp_path / "store", **_ray_kw())
    seen: list[dict] = []
    report = extract_ray(bert_export, str(path), tmp_path / "store", resume=True, on_shard=seen.append, **_ray_kw())
    ray_meta = report.store.meta["ray"]
    assert ray_meta["done_before"] >= 2  # ranges actors finished after the driver died are done too
    assert ray_meta["done_before"] + ray_meta["computed"] + ray_meta["reused"] == 5
    assert not {s["shard"] for s in seen} & set(recorded)  # the two recorded ranges were not run again
    assert report.resumed_rows == 512
    assert_same_store(plain, LayerStore.open(tmp_path / "store"))
    # the merged store is an ordinary one: a FAISS index builds from its memory-mapped arrays
    from layerscope.index.store_index import build_store_index

    meta = build_store_index(tmp_path / "store", tmp_path / "index", layer="-1", pooling="mean", kind="flat",
                             device="cpu")
    assert meta.n == 1100


@pytest.mark.ray
def test_resume_refuses_other_settings(ray_cluster, bert_export, small_corpus, tmp_path):
    from layerscope.errors import StoreError
    from layerscope.extraction.ray_extract import extract_ray

    path, _ = small_corpus
    kw = _ray_kw()
    extract_ray(bert_export, str(path), tmp_path / "store", **kw)
    kw["layers"] = "-1"
    with pytest.raises(StoreError, match="layers"):
        extract_ray(bert_export, str(path), tmp_path / "store", resume=True, **kw)
    with pytest.raises(InputError, match="ray-workers"):
        extract_ray(bert_export, str(path), tmp_path / "other", **{**kw, "workers": 0})
    # 3 actors of 1 CPU do not fit the 2-CPU cluster: an error instead of a pool waiting forever
    with pytest.raises(InputError, match="needs 3 CPUs"):
        extract_ray(bert_export, str(path), tmp_path / "other", **{**kw, "workers": 3})
    with pytest.raises(InputError, match="needs GPUs"):
        extract_ray(bert_export, str(path), tmp_path / "other2", **{**kw, "engine": "cuda"})


@pytest.mark.ray
@pytest.mark.slow
def test_cli_ray_local_over_sts_test_equals_the_plain_run(ray_cluster, sts_dir, minilm_export, tmp_path):
    """Done means: inspect extract --ray local over the 2,758 STS test sentences equals the plain run."""
    import shutil

    from layerscope.cli import main

    sentences = []
    with open(sts_dir / "sts-test.csv", encoding="utf-8", newline="") as fh:
        for line in fh:
            cols = line.rstrip("\r\n").split("\t")
            sentences.extend([cols[5], cols[6]])
    assert len(sentences) == 2758
    corpus_path = tmp_path / "sts.txt"
    corpus_path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    shutil.copytree(minilm_export, tmp_path / "minilm", symlinks=True)  # the session's export, with its files' times
    common = ["extract", "--model", str(tmp_path / "minilm"), "--input", str(corpus_path), "--engine", "ort",
              "--layers", "all", "--pooling", "mean,cls"]
    for extra, out in (([], "plain"), (["--ray", "local", "--ray-workers", "2"], "ray")):
        try:
            main(["-q", *common, "--out", str(tmp_path / out), *extra])
        except SystemExit as exc:
            assert exc.code in (None, 0), out
    plain, ray_store = LayerStore.open(tmp_path / "plain"), LayerStore.open(tmp_path / "ray")
    assert ray_store.n == 2758 and ray_store.meta["ray"]["computed"] == ray_store.meta["ray"]["shards"] > 1
    assert ray_store.meta["engine"]["provider"] == "CPUExecutionProvider"
    assert_same_store(plain, ray_store)


DRIVER = """
import sys, time
from layerscope.extraction.ray_extract import extract_ray

def hang(info):  # the first range is recorded; then the driver stalls until it is killed
    print("merged", info["shard"], flush=True)
    time.sleep(600)

extract_ray(sys.argv[1], sys.argv[2], sys.argv[3], address="local", engine="ort", layers="all",
            poolings=["mean", "cls"], text_field="body", id_field="doc", workers=2, shard_rows=256, on_shard=hang)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_driver_sigkilled_mid_run_resumes(ray_cluster, bert_export, small_corpus, tmp_path):
    """A real driver process (with the local cluster it started) SIGKILLed after its first merge."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    import layerscope
    from layerscope.extraction.ray_extract import extract_ray

    path, plain = small_corpus
    env = {**os.environ, "PYTHONPATH": str(Path(layerscope.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(bert_export), str(path), str(tmp_path / "store")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()  # blocks until the first shard is merged (or the driver dies)
        assert line.startswith("merged"), line
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and every Ray process it started
        proc.wait(timeout=60)
    half = LayerStore.open(tmp_path / "store", allow_incomplete=True)
    assert 0 < int(np.asarray(half.done_mask()).sum()) < 1100 and not half.complete
    report = extract_ray(bert_export, str(path), tmp_path / "store", resume=True, **_ray_kw())
    ray_meta = report.store.meta["ray"]
    assert ray_meta["done_before"] >= 1
    assert ray_meta["done_before"] + ray_meta["computed"] + ray_meta["reused"] == ray_meta["shards"] == 5
    assert_same_store(plain, LayerStore.open(tmp_path / "store"))


@pytest.mark.ray
def test_ray_force_and_resume_follow_the_plain_extract_rules(ray_cluster, bert_export, small_corpus, tmp_path):
    """Catches: extract_ray deleting --out on --force whatever it holds (it did shutil.rmtree(out)), and
    --resume reusing a store whose input file changed since."""
    import shutil

    from layerscope.errors import StoreError
    from layerscope.extraction.ray_extract import extract_ray

    path, plain = small_corpus
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.md").write_text("mine\n", encoding="utf-8")
    with pytest.raises(InputError, match="did not make"):
        extract_ray(bert_export, str(path), notes, force=True, **_ray_kw())
    assert (notes / "ideas.md").read_text(encoding="utf-8") == "mine\n"

    inside = tmp_path / "holds-input"
    inside.mkdir()
    corpus_copy = inside / "c.jsonl"
    shutil.copy(path, corpus_copy)
    extract_ray(bert_export, str(corpus_copy), inside / "store", **_ray_kw())
    with pytest.raises(InputError, match="input"):  # the corpus lives in the folder --force would replace
        extract_ray(bert_export, str(corpus_copy), inside, force=True, **_ray_kw())
    assert corpus_copy.exists()

    store = tmp_path / "store"
    mine = tmp_path / "mine.jsonl"
    shutil.copy(path, mine)
    extract_ray(bert_export, str(mine), store, **_ray_kw())
    mine.write_text(path.read_text(encoding="utf-8").replace("d00005", "x00005"), encoding="utf-8")
    with pytest.raises(StoreError, match="another version"):  # same path, other content
        extract_ray(bert_export, str(mine), store, resume=True, **_ray_kw())
    shutil.copy(path, mine)
    report = extract_ray(bert_export, str(mine), store, force=True, **_ray_kw())  # its own store: replaced
    assert report.n == plain.n
    assert_same_store(plain, LayerStore.open(store))


@pytest.mark.ray
def test_ray_with_a_prompt_equals_the_plain_run(ray_cluster, bert_export, small_corpus, tmp_path):
    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.ray_extract import extract_ray

    path, _ = small_corpus
    kw = dict(engine="ort", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc")
    plain = extract(bert_export, str(path), tmp_path / "plain", prompt="query: ", **kw).store
    report = extract_ray(bert_export, str(path), tmp_path / "ray", prompt="query: ", workers=2, shard_rows=256, **kw)
    assert report.store.spec.prompt == "query: " == plain.spec.prompt
    assert report.store.record.tokens == plain.record.tokens
    assert_same_store(plain, LayerStore.open(tmp_path / "ray"))


def _wait_for_port(port: int, timeout: float = 120.0) -> None:
    import socket
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            time.sleep(3)  # the GCS listens before the head's raylet has registered
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the Ray head never listened on {port}")


TWO_NODE_DRIVER = """
import ray
ray.init(address=__import__("sys").argv[4])
while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    __import__("time").sleep(0.5)
ray.shutdown()
import sys
from layerscope.extraction.ray_extract import extract_ray

r = extract_ray(sys.argv[1], sys.argv[2], sys.argv[3], address=sys.argv[4], engine="ort", layers="all",
                poolings=["mean", "cls"], text_field="body", id_field="doc", workers=2, shard_rows=256,
                cpus_per_worker=1)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_two_node_cluster_on_this_machine_equals_the_plain_run(bert_export, small_corpus, tmp_path):
    """A head and a second node (``ray start``, one CPU each): the actors land on both and write one store."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    import layerscope

    path, plain = small_corpus
    ray_bin = str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import shutil
    import tempfile

    # the nodes' sessions and the "current cluster" file in a directory of their own (short: socket paths are
    # limited), so no other Ray user of this machine finds or joins this cluster
    ray_tmp = tempfile.mkdtemp(prefix="ray2n-", dir="/tmp")
    env = {**os.environ, "PYTHONPATH": str(Path(layerscope.__file__).parents[1]), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_TMPDIR": ray_tmp}
    # each node runs in the foreground (--block) in its own session, so the finally stops exactly these two
    nodes: list[subprocess.Popen] = []
    try:
        nodes.append(subprocess.Popen([ray_bin, "start", "--head", "--block", "--port", str(port), "--num-cpus", "1",
                                       "--resources", '{"head": 1}', "--include-dashboard=false",
                                       "--disable-usage-stats"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env, start_new_session=True))
        _wait_for_port(port)
        nodes.append(subprocess.Popen([ray_bin, "start", "--block", "--address", f"127.0.0.1:{port}", "--num-cpus",
                                       "1", "--resources", '{"second": 1}', "--disable-usage-stats"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True))
        drv = subprocess.run([sys.executable, "-c", TWO_NODE_DRIVER, str(bert_export), str(path), str(tmp_path / "s"),
                              f"127.0.0.1:{port}"], capture_output=True, text=True, env=env, timeout=HANG_S)
        assert drv.returncode == 0, drv.stderr[-3000:]
    finally:
        import signal

        for node in reversed(nodes):
            try:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(node.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    store = LayerStore.open(tmp_path / "s")
    assert store.meta["ray"]["address"] == f"127.0.0.1:{port}" and store.meta["ray"]["computed"] == 5
    assert_same_store(plain, store)


@pytest.mark.ray
def test_in_process_shard_and_ray_open_the_engine_with_the_same_options(ray_cluster, tiny_model, tmp_path,
                                                                       monkeypatch):
    """The three executors run one request; each store's engine record holds the options its engine (in this
    process, a shard's, a Ray actor's) was opened with (``fake_engine`` notes them): all equal, and equal to the
    rule worked out by hand, not the corpus's longest text. Each looks the engine's name up in the registry
    once in this process (the Ray driver included; each actor's process looks it up once more)."""
    import json

    import fake_engine
    from layerscope.engines import registry

    lookups: list[str] = []
    real_spec = registry.engine_spec
    monkeypatch.setattr(registry, "engine_spec", lambda name: lookups.append(name) or real_spec(name))
    from layerscope.extraction.pipeline import InProcess
    from layerscope.extraction.ray_extract import RayExecutor
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import Shard

    texts = [f"text number {i} " + "word " * (i % 7) for i in range(40)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    model = str(tiny_model("bert"))
    # threads given: Ray would otherwise give each actor its share of the CPUs
    kw = dict(engine="fake", layers="0,1", poolings=["mean"], max_batch=16, engine_options={"threads": 1})
    executors = {"plain": InProcess(), "shard": Shard(0, 1),
                 "ray": RayExecutor(workers=1, cpus_per_worker=1, gpus_per_worker=0)}
    fake_engine.register_fake()
    try:
        opened, looked_up = {}, {}
        for name, executor in executors.items():
            lookups.clear()
            report = executor.run(ExtractionRequest.of(model, str(path), tmp_path / name, **kw))
            looked_up[name] = list(lookups)
            assert report.complete and report.n == len(texts)
            notes = [n for n in report.store.meta["engine"]["notes"] if n.startswith(fake_engine.OPENED)]
            assert len(notes) == 1, (name, report.store.meta["engine"])
            opened[name] = json.loads(notes[0][len(fake_engine.OPENED):])
    finally:
        fake_engine.unregister_fake()
    limit = json.loads((tmp_path / "plain" / "store.json").read_text())["manifest"]["max_length"]
    # by hand: layers 0,1 run to depth 1, the model's own limit bounds the sequence, the tiny BERT's graph pools
    # nothing (no pooled-only run), the user's option is kept
    assert opened["plain"] == {"max_batch": 16, "max_seq": limit, "depth": 1, "pooled_only": False, "threads": 1}
    assert opened["shard"] == opened["plain"] and opened["ray"] == opened["plain"]
    assert max(len(t.split()) for t in texts) + 2 < limit  # the corpus alone would have given a shorter profile
    assert looked_up == {"plain": ["fake"], "shard": ["fake"], "ray": ["fake"]}
