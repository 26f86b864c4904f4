"""``extract --shard i/N``: independent processes writing one store directly equal a plain run.

The shards run as real separate processes (``python tests/fake_engine.py extract ...``: the CLI with the
test-only ``fake`` engine registered), so claims, locks and faults are the ones a Slurm array meets.
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

import fake_engine
from store_checks import assert_same_store

from layerscope.store import store_ranges
from layerscope.store.range_marks import DoneMark
from layerscope.store.store import LayerStore
from layerscope.store.store_record import RangePlan
from hang_guard import HANG_S  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
pytestmark = pytest.mark.usefixtures("fake")  # the test-only engine (tests/extraction/conftest.py)
N = 1100  # five ranges of 256 rows (the last one 76)


@pytest.fixture(scope="module")
def setup(fake, tiny_model, tmp_path_factory):
    """The tiny BERT, a corpus with ids, a NUL byte and empty rows, and the plain run's store of it."""
    from layerscope.extraction.pipeline import extract

    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 40)))) for _ in range(N)]
    texts[3], texts[7] = "   ", "nul\x00inside"
    path = root / "c.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"doc": f"d{i:05d}", "body": t}) + "\n")
    model = str(tiny_model("bert"))
    plain = extract(model, str(path), root / "plain", engine="fake", layers="all", poolings=["mean", "cls"],
                    text_field="body", id_field="doc", prompt="query: ").store
    return model, path, plain


@pytest.fixture(scope="module")
def first_half(setup, tmp_path_factory):
    """The store after shard 0/2 ran alone (as a real process): what every damaged-file test starts from, each
    with a copy of its own."""
    model, path, _ = setup
    out = tmp_path_factory.mktemp("first-half") / "store"
    first = _run(_cmd(model, path, out, "0/2"))
    assert first.returncode == 0, first.stderr
    return out


def _copy_of(store: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(store, to, symlinks=True)
    return to


def _cmd(model, path, out, shard, *extra):
    return [sys.executable, str(TESTS / "fake_engine.py"), "-q", "extract", "--model", model, "--input", str(path),
            "--out", str(out), "--engine", "fake", "--layers", "all", "--pooling", "mean,cls", "--text-field", "body",
            "--id-field", "doc", "--prompt", "query: ", "--shard", shard, *extra]


def _env(**extra):
    import layerscope

    paths = [str(Path(layerscope.__file__).parents[1]), str(TESTS)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "LAYERSCOPE_RANGE_ROWS": "256", **extra}


def _run(args, **env):
    return subprocess.run(args, capture_output=True, text=True, env=_env(**env), timeout=HANG_S)


def test_shards_in_separate_processes_equal_the_plain_run(setup, tmp_path):
    model, path, plain = setup
    out = tmp_path / "store"
    procs = [subprocess.Popen(_cmd(model, path, out, f"{i}/3"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(LAYERSCOPE_RANGE_ROWS="512")) for i in range(3)]
    results = [p.communicate(timeout=HANG_S) for p in procs]
    for p, (so, se) in zip(procs, results):
        assert p.returncode == 0, se
    store = LayerStore.open(out)
    assert store.record.ranges == RangePlan(rows=512, count=3)  # ranges of two granules: [0, 512), [512, 1024), ...
    assert store.spec.prompt == "query: " == plain.spec.prompt
    assert store.nul_texts == plain.nul_texts == 1
    assert store.nul_dropped_by_tokenizer == plain.nul_dropped_by_tokenizer
    assert store.record.tokens == plain.record.tokens and store.record.warnings == plain.record.warnings
    assert np.array_equal(np.load(out / "lengths.npy"), np.load(plain.path / "lengths.npy"))
    assert_same_store(plain, store)
    assert not (out / "ranges").exists()
    status = _run([*_cmd(model, path, out, "status")])
    assert status.returncode == 0 and "complete (3 ranges)" in status.stdout


def test_shard_killed_mid_range_then_rerun(setup, tmp_path):
    """SIGKILL inside a range (after its claim, before its done mark): the rerun takes the stale claim
    over and the store equals the plain run; the other shard finishes the store only when it is whole."""
    model, path, plain = setup
    out = tmp_path / "store"
    victim = subprocess.Popen(_cmd(model, path, out, "0/2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(**{fake_engine.STALL_RANGE: "2"}))
    try:
        deadline = time.time() + 120
        while not store_ranges.claim_path(out, 2).exists():  # range 2 claimed: the shard sleeps inside it
            assert victim.poll() is None and time.time() < deadline, victim.stderr.read() if victim.poll() else ""
            time.sleep(0.1)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    assert store_ranges.is_done(out, 0) and not store_ranges.is_done(out, 2)
    other = _run(_cmd(model, path, out, "1/2"))
    assert other.returncode == 0, other.stderr
    assert not LayerStore.open(out, allow_incomplete=True).complete  # range 2 is missing: not finished
    status = _run(_cmd(model, path, out, "status"))
    assert "3 of 5 ranges done" in status.stdout and "left by a worker that died" in status.stdout
    finish = _run(_cmd(model, path, out, "finish"))
    assert finish.returncode != 0 and "2 of 5 ranges are not done" in finish.stderr and "Traceback" not in finish.stderr
    rerun = _run(_cmd(model, path, out, "0/2"))
    assert rerun.returncode == 0, rerun.stderr
    assert "2 of 3 ranges written" in rerun.stdout and "1 done before" in rerun.stdout
    assert_same_store(plain, LayerStore.open(out))


def test_shard_run_twice_and_two_shards_claiming_one_range(setup, tmp_path):
    model, path, plain = setup
    out = tmp_path / "store"
    # two processes given the same shard at once: each range is written by one of them
    twins = [subprocess.Popen(_cmd(model, path, out, "0/2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(**{fake_engine.RANGE_DELAY: "0.5"})) for _ in range(2)]
    outs = [t.communicate(timeout=HANG_S) for t in twins]
    assert all(t.returncode == 0 for t in twins), [o[1] for o in outs]
    written = [int(o[0].split(": ")[1].split(" of")[0]) for o in outs]
    assert sum(written) == 3, outs  # ranges 0, 2, 4, each once
    again = _run(_cmd(model, path, out, "0/2"))  # the same shard run a second time: nothing to do
    assert again.returncode == 0 and "0 of 3 ranges written" in again.stdout and "3 done before" in again.stdout
    last = _run(_cmd(model, path, out, "1/2"))
    assert last.returncode == 0 and "the store is complete" in last.stdout, last.stderr
    assert_same_store(plain, LayerStore.open(out))
    done = _run(_cmd(model, path, out, "1/2"))  # after completion: nothing, and no error
    assert done.returncode == 0


def test_claims_refuse_a_live_holder_and_take_over_a_dead_one(tmp_path):
    (tmp_path / "ranges").mkdir()
    first = store_ranges.try_claim(tmp_path, 0)
    assert first is not None and first.held()
    assert store_ranges.try_claim(tmp_path, 0) is None  # live (this process)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    info = json.loads(first.path.read_text())
    first.path.write_text(json.dumps({**info, "pid": dead.pid}))  # as if a process now gone had claimed it
    assert store_ranges.claim_is_stale(first.path)
    second = store_ranges.try_claim(tmp_path, 0)
    assert second is not None and second.token != first.token and not first.held()
    store_ranges.mark_done(tmp_path, 0, DoneMark(0))
    second.release()
    assert store_ranges.try_claim(tmp_path, 0) is None  # done: nobody claims it again
    # another host's claim is stale only once its lease has run out
    other = store_ranges.claim_path(tmp_path, 1)
    other.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "x"}))
    assert not store_ranges.claim_is_stale(other)
    old = time.time() - store_ranges.LEASE_S - 5
    os.utime(other, (old, old))
    assert store_ranges.claim_is_stale(other)


def test_a_range_is_marked_done_only_after_its_data_is_fsynced(setup, tmp_path, monkeypatch):
    """The order on disk: every array and lengths.npy written and fsync'd, then the done mark."""
    from layerscope.extraction import range_writer
    from layerscope.extraction.range_run import open_or_create, open_engine_for
    from layerscope.extraction.request import ExtractionRequest

    model, path, _ = setup
    req = ExtractionRequest.of(model, str(path), tmp_path / "s", engine="fake", layers="all",
                               poolings=["mean", "cls"], text_field="body", id_field="doc", resume=True)
    ex, store = open_or_create(req, range_rows=256)
    writer = range_writer.RangeWriter(store.path, open_engine_for(ex, req), layers=ex.layers,
                                      poolings=ex.poolings, store_dtype="float32", max_length=ex.max_length,
                                      prompt=None, batch_tokens=None, max_batch=64)
    events: list[tuple[str, str]] = []
    real_pwrite, real_fsync, real_done = os.pwrite, os.fsync, store_ranges.mark_done
    fds: dict[int, str] = {}
    real_open = os.open

    def spy_open(p, flags, *a):
        fd = real_open(p, flags, *a)
        fds[fd] = str(p)
        return fd

    monkeypatch.setattr(range_writer.os, "open", spy_open)
    monkeypatch.setattr(range_writer.os, "pwrite", lambda fd, b, o: (events.append(("write", fds[fd])),
                                                                     real_pwrite(fd, b, o))[1])
    monkeypatch.setattr(range_writer.os, "fsync", lambda fd: (events.append(("fsync", fds.get(fd, "?"))),
                                                              real_fsync(fd))[1])
    monkeypatch.setattr(store_ranges, "mark_done", lambda d, k, rep: (events.append(("done", str(k))),
                                                                      real_done(d, k, rep))[1])
    r = range_run_ranges(store)[1]
    writer.run(r)
    files = {f for kind, f in events if kind == "write"}
    assert len(files) == 2 * (len(ex.layers)) + 1  # every array and lengths.npy
    mark = events.index(("done", "1"))
    assert all(kind != "write" for kind, _ in events[mark:])
    for f in files:  # each file's write is followed by its fsync before the done mark
        w = events.index(("write", f))
        assert ("fsync", f) in events[w:mark]
    assert store_ranges.is_done(store.path, 1)


def range_run_ranges(store):
    from layerscope.extraction.range_run import ranges_of

    return ranges_of(store)


def test_bad_shard_specs_are_one_line(setup, tmp_path):
    model, path, _ = setup
    for name, value in (("LAYERSCOPE_RANGE_ROWS", "300"), ("LAYERSCOPE_RANGE_ROWS", "many"),
                        ("LAYERSCOPE_SHARD_LOCK_WAIT", "-1")):
        r = _run(_cmd(model, path, tmp_path / "s", "0/2"), **{name: value})
        assert r.returncode == 2 and f"{name}={value!r}: it must be" in r.stderr and "Traceback" not in r.stderr
    for spec in ("2/2", "x", "1/0"):
        r = _run(_cmd(model, path, tmp_path / "s", spec))
        assert r.returncode == 2 and "--shard takes i/N" in r.stderr and "Traceback" not in r.stderr
    r = _run(_cmd(model, path, tmp_path / "s", "0/2", "--force"))
    assert r.returncode == 2 and "--force with --shard" in r.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_size_shards_equal_the_plain_run_within_the_recorded_bound(setup, tmp_path, dtype):
    """A half-size store from shards equals a half-size plain run exactly and float32 within the bound its
    store.json records; every reader gets float32; the disk holds half the bytes."""
    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard

    model, path, plain32 = setup
    kw = dict(engine="fake", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc",
              prompt="query: ")
    half_plain = extract(model, str(path), tmp_path / "plain", store_dtype=dtype, **kw).store
    req = ExtractionRequest.of(model, str(path), tmp_path / "sh", store_dtype=dtype, **kw)
    reports = [extract_shard(req, i, 2, range_rows=256) for i in range(2)]
    assert reports[-1].ranges.finished and reports[-1].complete
    sharded = LayerStore.open(tmp_path / "sh")
    assert sharded.dtype == half_plain.dtype == dtype
    assert_same_store(half_plain, sharded, atol=0.0)
    bounds = sharded.half_error
    assert set(bounds) == {f"{p}/{layer}" for p in sharded.poolings for layer in sharded.layers}
    for p in sharded.poolings:
        for layer in sharded.layers:
            x32, xh = np.asarray(plain32[p, layer], np.float64), sharded[p, layer]
            assert xh.dtype == np.float32
            rec = bounds[f"{p}/{layer}"]
            # plain32 came from other batches (float32 sums in another order): 1e-6 of slack for that alone
            assert np.abs(x32 - xh).max() <= rec.max_abs_error + 1e-6
            cos = (x32 * xh).sum(1) / np.maximum(np.linalg.norm(x32, axis=1) * np.linalg.norm(xh, axis=1), 1e-30)
            assert cos[np.linalg.norm(x32, axis=1) > 0].min() >= rec.min_cosine - 1e-6
            assert rec == half_plain.half_error[f"{p}/{layer}"]
    raw = sharded.raw(("mean", "1"))
    assert raw.dtype == (np.uint16 if dtype == "bfloat16" else np.float16)
    assert (tmp_path / "sh" / "arrays" / "mean" / "1.npy").stat().st_size < \
        0.51 * (plain32.path / "arrays" / "mean" / "1.npy").stat().st_size


def test_a_half_size_store_below_the_bar_is_refused(setup, tmp_path, monkeypatch):
    from layerscope.errors import StoreError
    from layerscope.store import store_dtype
    from layerscope.extraction.pipeline import extract

    model, path, _ = setup
    monkeypatch.setitem(store_dtype.MIN_COSINE, "bfloat16", 1.0)  # no bfloat16 rounding keeps cosine 1 exactly
    with pytest.raises(StoreError, match=r"bfloat16 keeps the vectors of .* only to cosine .*use --store-dtype float32"):
        extract(model, str(path), tmp_path / "s", engine="fake", poolings=["mean"], store_dtype="bfloat16",
                text_field="body", id_field="doc")
    assert not LayerStore.open(tmp_path / "s", allow_incomplete=True).complete


def test_a_plain_resume_of_a_sharded_store_is_refused(setup, tmp_path):
    """Its lengths are written range by range: a plain --resume would batch unfinished rows as empty."""
    from layerscope.errors import StoreError
    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard

    model, path, plain = setup
    kw = dict(engine="fake", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc",
              prompt="query: ")
    extract_shard(ExtractionRequest.of(model, str(path), tmp_path / "s", **kw), 0, 2, range_rows=256)
    with pytest.raises(StoreError, match="--shard i/N"):
        extract(model, str(path), tmp_path / "s", resume=True, **kw)
    extract_shard(ExtractionRequest.of(model, str(path), tmp_path / "s", **kw), 1, 2, range_rows=256)
    assert_same_store(plain, LayerStore.open(tmp_path / "s"))


def test_a_shard_whose_store_was_deleted_and_made_again_writes_nothing_into_the_new_one(setup, tmp_path):
    """A shard frozen inside a range while its store is deleted and made again (another prompt) at the same
    path: on waking it refuses in one line instead of writing its rows into the new store, and the new store
    ends equal to its own plain run."""
    import shutil

    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard

    model, path, _ = setup
    kw = dict(engine="fake", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc",
              prompt="passage: ")
    plain_new = extract(model, str(path), tmp_path / "plain", **kw).store
    out = tmp_path / "store"
    old = subprocess.Popen(_cmd(model, path, out, "0/2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(FAKE_RANGE_DELAY="2"))
    try:
        deadline = time.time() + 120
        while not store_ranges.claim_path(out, 0).exists():
            assert old.poll() is None and time.time() < deadline, old.stderr.read() if old.poll() else ""
            time.sleep(0.02)
        old.send_signal(signal.SIGSTOP)  # inside range 0, before its rows are written
        shutil.rmtree(out)
        extract_shard(ExtractionRequest.of(model, str(path), out, **kw), 1, 2, range_rows=256)
        old.send_signal(signal.SIGCONT)
        so, se = old.communicate(timeout=HANG_S)
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
    assert old.returncode == 2, (so, se)
    assert "no longer the store this writer opened" in se and "Traceback" not in se, se
    for k in (0, 2, 4):
        assert not store_ranges.is_done(out, k)
    rest = _run(_cmd(model, path, out, "0/2", "--prompt", "passage: "))
    assert rest.returncode == 0, rest.stderr
    assert_same_store(plain_new, LayerStore.open(out))


def test_done_marks_of_another_store_do_not_count_and_verify_names_them(setup, tmp_path):
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard, shard_finish

    model, path, _ = setup
    kw = dict(engine="fake", layers="all", poolings=["mean"], text_field="body", id_field="doc")
    out = tmp_path / "s"
    extract_shard(ExtractionRequest.of(model, str(path), out, **kw), 0, 2, range_rows=256)
    for k in (1, 3):  # as a writer of a store deleted since would have left them
        store_ranges.mark_done(out, k, DoneMark(k, store="0" * 32))
    assert sorted(store_ranges.status(out, range_run_ranges(LayerStore.open(out, allow_incomplete=True)),
                                      store_id=LayerStore.open(out, allow_incomplete=True).store_id).missing) \
        == [1, 3]
    problems = LayerStore.verify(out)[1]
    assert any("marked done by a writer of another store" in p for p in problems), problems
    from layerscope.errors import StoreError

    with pytest.raises(StoreError, match="another store"):
        shard_finish(out)


def _claim(out: Path, k: int, body) -> None:
    (out / "ranges").mkdir(exist_ok=True)
    store_ranges.claim_path(out, k).write_text(json.dumps(body), encoding="utf-8")


def test_a_claim_left_as_pid_1_and_damaged_claims_do_not_stall_or_crash(setup, tmp_path):
    """A shard killed in a container leaves its claim naming pid 1 (alive: the rerun's own init); damaged
    claims name no process at all. The rerun takes each over, --shard status counts them, and the store ends
    equal to the plain run."""
    import socket

    model, path, plain = setup
    out = tmp_path / "store"
    victim = subprocess.Popen(_cmd(model, path, out, "0/2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(FAKE_STALL_RANGE="2"))
    try:
        deadline = time.time() + 120
        while not store_ranges.claim_path(out, 2).exists():
            assert victim.poll() is None and time.time() < deadline, victim.stderr.read() if victim.poll() else ""
            time.sleep(0.1)
        time.sleep(0.3)  # the claim's body is written
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    left = json.loads(store_ranges.claim_path(out, 2).read_text())
    _claim(out, 2, {**left, "pid": 1})  # what the killed shard wrote, seen from inside its container
    host = socket.gethostname()
    _claim(out, 1, {"host": host, "pid": "abc", "token": "t"})
    _claim(out, 3, [1, 2])
    _claim(out, 4, {"host": host, "pid": 10 ** 30, "token": "t"})
    status = _run(_cmd(model, path, out, "status"))
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert "1 of 5 ranges done" in status.stdout, status.stdout
    first = _run(_cmd(model, path, out, "1/2"))
    assert first.returncode == 0 and "2 of 2 ranges written" in first.stdout, (first.stdout, first.stderr)
    second = _run(_cmd(model, path, out, "0/2"))
    assert second.returncode == 0 and "2 of 3 ranges written" in second.stdout, (second.stdout, second.stderr)
    assert_same_store(plain, LayerStore.open(out))


@pytest.mark.parametrize("body", [{"pid": 0}, {"pid": -1}, {"pid": "12"}, {"pid": 2 ** 64}, {"pid": True},
                                  {"pid": None}, [3, 4], "text", 7])
def test_a_damaged_claim_is_stale_at_once(body, tmp_path):
    import socket

    _claim(tmp_path, 0, {"host": socket.gethostname(), "token": "t", **body} if isinstance(body, dict) else body)
    assert store_ranges.claim_is_stale(store_ranges.claim_path(tmp_path, 0))
    taken = store_ranges.try_claim(tmp_path, 0)
    assert taken is not None and taken.held()


def test_a_reused_pid_or_another_boot_makes_a_claim_stale(tmp_path):
    """The pid alone does not say the claimant lives: its start time and the boot id must match too."""
    first = store_ranges.try_claim(tmp_path, 0)
    info = json.loads(first.path.read_text())
    if info["started"] is None or info["boot"] is None:
        pytest.skip("no /proc start times or boot id on this system")
    assert info["pid"] == os.getpid() and not store_ranges.claim_is_stale(first.path)
    first.path.write_text(json.dumps({**info, "started": info["started"] - 1}))  # this pid, another process
    assert store_ranges.claim_is_stale(first.path)
    first.path.write_text(json.dumps({**info, "boot": "another-boot"}))
    assert store_ranges.claim_is_stale(first.path)
    first.path.write_text(json.dumps(info))
    assert not store_ranges.claim_is_stale(first.path)


def test_a_damaged_offsets_file_is_one_line_not_wrong_texts(setup, first_half, tmp_path):
    """ray-offsets.npy edited to point a range at other rows (still line starts, still increasing): the shard
    that reads it refuses in one line and writes nothing; verify names the file."""
    model, path, _ = setup
    out = _copy_of(first_half, tmp_path / "store")
    offsets = np.load(out / store_ranges.OFFSETS)
    edited = np.concatenate([offsets[:1], offsets[2:], offsets[-1:]])  # range k reads range k+1's texts
    assert edited.shape == offsets.shape and bool((np.diff(edited) >= 0).all())
    np.save(out / store_ranges.OFFSETS, edited)
    problems = LayerStore.verify(out)[1]
    assert any("ray-offsets.npy does not match the sha256" in p for p in problems), problems
    second = _run(_cmd(model, path, out, "1/2"))
    assert second.returncode == 2, (second.stdout, second.stderr)
    assert "ray-offsets.npy does not match the sha256" in second.stderr and "Traceback" not in second.stderr
    assert not store_ranges.is_done(out, 1) and not store_ranges.is_done(out, 3)


def test_an_ill_typed_done_mark_is_one_line_when_the_store_is_finished(setup, first_half, tmp_path):
    """A range's done mark edited (its batch size written as text): the shard that finishes the store says which
    file and which field, in one line, instead of a TypeError while the ranges' records are merged."""
    model, path, _ = setup
    out = _copy_of(first_half, tmp_path / "store")
    mark = store_ranges.done_path(out, 0)
    mark.write_text(json.dumps({**json.loads(mark.read_text()), "batch_tokens": "64"}), encoding="utf-8")
    second = _run(_cmd(model, path, out, "1/2"))
    assert second.returncode == 2, (second.stdout, second.stderr)
    assert f"{mark}: batch_tokens is str, not int" in second.stderr and "Traceback" not in second.stderr


def _pickled(path: Path) -> None:
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["ray-offsets.npy", "lengths.npy"])
@pytest.mark.parametrize("damage", [_pickled, _truncated])
def test_a_pickled_or_truncated_internal_file_is_one_line(name, damage, setup, first_half, tmp_path):
    model, path, _ = setup
    out = _copy_of(first_half, tmp_path / "store")
    damage(out / name)
    r = _run(_cmd(model, path, out, "1/2"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert name in r.stderr and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    from layerscope.errors import StoreError
    from layerscope.extraction.shard_extract import shard_finish, shard_status

    if name == store_ranges.OFFSETS:
        with pytest.raises(StoreError, match=name):
            shard_status(out)
    with pytest.raises(StoreError, match=name):
        shard_finish(out)
    assert not LayerStore.open(out, allow_incomplete=True).complete
