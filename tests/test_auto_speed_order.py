"""``auto``'s CPU order comes from speeds measured on this CPU by ``layerscope bench``; peers are marked final-layer-only."""

from __future__ import annotations

import json

import pytest

from layerscope.engines import speed_order
from layerscope.engines import auto
from layerscope.engines.auto import pick_engine

SHA = "a" * 64
# the engines' declared auto ranks (engines/registry.py), fastest first
DECLARED = (("trt", None, "fp32"), ("cuda", None, "fp32"), ("ov", "bf16", "ov-bf16"), ("ov", "int8", "ov-int8"),
            ("ort", "gqa", "gqa"), ("ort", "int8-block", "int8-block"), ("ort", "int8", "int8"), ("ov", None, "ov-fp32"), ("ort", None, "fp32"))
CPU_RANK = DECLARED[2:]


def _bench(speeds: dict[str, float], *, texts: int = 2758, kind: str = "layerscope-bench-isolated",
           sha: str = SHA, model: str = "minilm") -> dict:
    rows = [{"engine": n, "kind": "engine", "available": True, "texts_per_s": v} for n, v in speeds.items()]
    rows.append({"engine": "st-onnx", "kind": "peer", "available": True, "texts_per_s": 5000.0, "layers": ["6"]})
    return {"kind": kind, "model": {"source": model, "onnx_sha256": sha}, "corpus": {"name": "sts", "texts": texts},
            "settings": {"layers": [str(i) for i in range(7)]}, "results": rows}


def test_without_a_bench_the_declared_order_is_kept_and_said(tmp_path):
    order, source = speed_order.ranked(CPU_RANK, SHA, root=tmp_path)
    assert order == list(CPU_RANK) and "declared order" in source


def test_measured_engines_take_the_declared_slots_fastest_first(tmp_path):
    """Catches: ranking that ignores the record, ranks slowest first, or moves unmeasured engines."""
    assert speed_order.record(_bench({"ort": 900.0, "ov": 500.0, "ort-int8": 700.0}), "b.json", root=tmp_path) == 3
    order, source = speed_order.ranked(CPU_RANK, SHA, root=tmp_path)
    names = [speed_order.bench_name(e, v) for e, v, _ in order]
    # declared: ov-bf16, ov-int8, ort-gqa, ort-int8-block, ort-int8, ov, ort; the measured slots (4..6) get ort,
    # ort-int8, ov; the unmeasured keep theirs
    assert names == ["ov-bf16", "ov-int8", "ort-gqa", "ort-int8-block", "ort", "ort-int8", "ov"]
    assert "ort 900, ort-int8 700, ov 500" in source and "same export" in source and "minilm" in source
    assert speed_order.speed_of(source, "ort", None) == ", 900 texts/s measured here"
    assert speed_order.speed_of(source, "ov", "bf16") == ""


def test_short_in_process_or_empty_benches_are_not_recorded(tmp_path):
    assert speed_order.record(_bench({"ort": 1.0}, texts=4), root=tmp_path) == 0
    assert speed_order.record(_bench({"ort": 1.0}, kind="layerscope-bench"), root=tmp_path) == 0
    assert speed_order.record(_bench({}), root=tmp_path) == 0  # peers only: nothing auto can pick
    assert not (tmp_path / speed_order.SPEEDS_FILE).exists()


def test_the_same_export_wins_over_a_later_run_of_another(tmp_path):
    speed_order.record(_bench({"ort": 900.0, "ov": 500.0}), root=tmp_path)
    speed_order.record(_bench({"ort": 100.0, "ov": 800.0}, sha="b" * 64, model="other"), root=tmp_path)
    assert speed_order.measured_run(SHA, root=tmp_path)["texts_per_s"]["ort"] == 900.0
    assert speed_order.measured_run("c" * 64, root=tmp_path)["model"] == "other"
    data = json.loads((tmp_path / speed_order.SPEEDS_FILE).read_text())
    (key, entry), = data.items()
    assert key == speed_order.cpu_identity()[0] and len(entry["runs"]) == 2


def test_cpu_identity_depends_on_the_engine_relevant_flags():
    base = "model name\t: Some CPU\nflags\t\t: fpu avx2 fma\n"
    assert speed_order.cpu_identity(base)[0] != speed_order.cpu_identity(base.replace("fma", "fma avx512_bf16"))[0]
    assert speed_order.cpu_identity(base)[0] == speed_order.cpu_identity(base.replace("fpu", "fpu sse4_2"))[0]
    assert speed_order.cpu_identity(base, cores=2)[1] == "Some CPU (avx2, fma), 2 cores"
    assert speed_order.cpu_identity(base, cores=2)[0] != speed_order.cpu_identity(base, cores=16)[0]


def test_a_record_taken_on_other_cores_is_not_used(tmp_path, monkeypatch):
    """Catches: a speed recorded on 2 cores ranking the engines of a 16-core run of the same CPU model."""
    monkeypatch.setattr(speed_order, "usable_cores", lambda: 2)
    assert speed_order.record(_bench({"ort": 900.0, "ov": 500.0}), root=tmp_path) == 2
    assert speed_order.measured_run(SHA, root=tmp_path)["texts_per_s"]["ort"] == 900.0
    order, _ = speed_order.ranked(CPU_RANK, SHA, root=tmp_path)
    assert order != list(CPU_RANK)  # on the cores it was taken on, the record reorders
    monkeypatch.setattr(speed_order, "usable_cores", lambda: 16)
    assert speed_order.measured_run(SHA, root=tmp_path) is None
    order, source = speed_order.ranked(CPU_RANK, SHA, root=tmp_path)
    assert order == list(CPU_RANK) and "declared order" in source


def test_usable_cores_follow_the_affinity(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
    monkeypatch.setattr(speed_order, "Path", lambda p: type("P", (), {"read_text": lambda self: "max 100000"})())
    assert speed_order.usable_cores() == 3
    # a cgroup quota of 1.5 CPUs (150000 us per 100000 us) on those 3 cores: 2 cores' worth of threads
    monkeypatch.setattr(speed_order, "Path", lambda p: type("P", (), {"read_text": lambda self: "150000 100000"})())
    assert speed_order.usable_cores() == 2


def _manifest(**recorded):
    """A typed manifest holding only what auto reads: the graph's sha256 and the parities recorded."""
    from layerscope.model.manifest_type import Manifest

    return Manifest.from_dict({"source": {"spec": "x", "path_or_id": "x"}, "family": "bert", "num_layers": 1,
                               "hidden_size": 4, "onnx_sha256": SHA, **recorded})


class _Handle:
    is_export = True

    def __init__(self):
        one = {"outputs": {"hidden_states.1": {"min_cos": 1.0, "max_abs": 0.0}}}
        self.manifest = _manifest(parity=one, variants={"ov-fp32": {"file": "model.onnx", "parity": one}})


class _Engine:
    def __init__(self, name, handle, *, spec, **options):
        from types import SimpleNamespace

        self.name, self.variant, self.spec = name, options.get("variant"), spec
        self.info = SimpleNamespace(notes=[])


@pytest.fixture
def no_gpu(monkeypatch):
    """The registry as auto sees it, with engines that always start on CPU and GPU ones that never do."""
    from layerscope.engines.registry import EngineSpec
    from layerscope.errors import EngineUnavailableError

    def unavailable(h, **o):
        raise EngineUnavailableError("no GPU here")

    def declared(name, factory):
        return EngineSpec(name, "a test engine", needs_export=True, device="any", factory=factory)

    specs = {n: declared(n, lambda h, _n=n, **o: _Engine(_n, h, **o)) for n in ("torch", "ort", "ov")}
    specs.update({n: declared(n, unavailable) for n in ("trt", "cuda")})
    monkeypatch.setattr(auto, "engines", lambda: specs)
    monkeypatch.setattr(auto, "auto_order", lambda *, explicit_variant: list(DECLARED))
    monkeypatch.setattr(auto, "fallback_engine", lambda: specs["torch"])


def test_declared_ranks_are_the_registry_s():
    from layerscope.engines.registry import auto_order

    assert tuple(auto_order(explicit_variant=False)) == DECLARED


def test_auto_picks_by_the_speed_measured_here_and_says_which_figure(no_gpu, tmp_path, monkeypatch):
    """ov fp32 is declared faster than ort fp32; measured here the other way round, auto picks ort.
    Catches: pick_engine still walking CPU_RANK as declared, and a note that does not name the figure."""
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path))
    eng = pick_engine(_Handle())
    assert eng.name == "ov" and "declared order" in eng.info.notes[0]
    speed_order.record(_bench({"ort": 900.0, "ov": 500.0}), "bench.json")
    eng = pick_engine(_Handle())
    note = eng.info.notes[0]
    assert eng.name == "ort", note
    assert "900 texts/s measured here" in note and "layerscope bench" in note and "ov 500" in note


def test_bench_table_and_plot_mark_peers_as_final_layer_only():
    """Catches: a peer row shown like an all-layer row in bench.md or bench.png."""
    from layerscope.bench.isolated_report import final_only
    from layerscope.bench.report import FINAL_ONLY, bar_labels

    bench = _bench({"ort": 900.0})
    assert bar_labels(bench) == ["ort", "st-onnx" + FINAL_ONLY]
    layers = bench["settings"]["layers"]
    assert final_only(bench["results"][1], layers) and not final_only({"kind": "engine", "layers": layers}, layers)


class _ExportOnlyHandle:
    """An export with only its own parity recorded: no OpenVINO or int8 variant was ever checked."""

    is_export = True

    def __init__(self, min_cos: float = 0.999995):
        self.manifest = _manifest(parity={"outputs": {"hidden_states.1": {"min_cos": min_cos}}})


def test_fp32_engines_inherit_the_export_s_parity_and_go_by_speed(no_gpu, tmp_path, monkeypatch):
    """ov at fp32 runs the export's own graph: with only the export's parity recorded, auto still weighs it, and
    picks between it and ort by the speed measured here.  Catches: ov fp32 passed over as 'accuracy not
    recorded', and a variant (int8, bf16) wrongly given the fp32 graph's parity."""
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path))
    eng = pick_engine(_ExportOnlyHandle())  # declared: ov fp32 (rank 60) before ort fp32 (rank 70)
    note = eng.info.notes[0]
    assert (eng.name, eng.variant) == ("ov", None), note
    assert "min cosine 0.999995 (the export's fp32 parity)" in note
    for variant in ("ov bf16", "ov int8", "ort int8"):
        assert f"{variant}: accuracy not recorded" in note
    speed_order.record(_bench({"ort": 900.0, "ov": 1000.0}), "bench.json")
    assert pick_engine(_ExportOnlyHandle()).name == "ov"
    speed_order.record(_bench({"ort": 1100.0, "ov": 1000.0}), "bench.json")
    eng = pick_engine(_ExportOnlyHandle())
    assert (eng.name, eng.variant) == ("ort", None) and "1,100 texts/s measured here" in eng.info.notes[0]
    # the inherited parity is held to --min-cosine like a recorded one
    eng = pick_engine(_ExportOnlyHandle(min_cos=0.99), min_cosine=0.9999)
    assert eng.name == "torch" and "ov: min cosine 0.990000 < 0.9999" in eng.info.notes[0]
