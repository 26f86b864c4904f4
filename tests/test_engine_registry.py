"""The engine registry (engines/registry.py) is the one list of engines: everything else reads it."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from layerscope.engines import registry
from layerscope.engines.registry import AutoRank, BenchRow, EngineSpec
from layerscope.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src" / "layerscope"


def test_each_engine_class_is_declared_under_its_own_name():
    """Catches: a declaration pasted onto the wrong class (e.g. the TensorRT spec on the CUDA engine)."""
    for name, spec in registry.engines().items():
        if isinstance(spec.factory, type):
            assert spec.factory.name == name
    assert set(registry.engine_names()) == {"torch", "torch-fp16", "torch-bf16", "ort", "ov", "cuda", "trt", "auto"}


def test_auto_tries_todays_order():
    """Catches: a mistyped rank that reorders auto (GPU engines first, then the CPU order the benchmarks measured)."""
    assert registry.auto_order(explicit_variant=False) == [
        ("trt", None, "fp32"), ("cuda", None, "fp32"), ("ov", "bf16", "ov-bf16"), ("ov", "int8", "ov-int8"),
        ("ort", "gqa", "gqa"), ("ort", "int8-block", "int8-block"), ("ort", "int8", "int8"), ("ov", None, "ov-fp32"),
        ("ort", None, "fp32")]
    assert registry.auto_order(explicit_variant=True) == [("trt", None, ""), ("cuda", None, ""), ("ort", None, "")]
    assert registry.fallback_engine().name == "torch"
    assert registry.gpu_engines() == ["trt", "cuda"]


class _Recorder:
    def __init__(self, handle, *, spec, **options):
        self.spec, self.options = spec, options
        self.info = SimpleNamespace(notes=[])


@pytest.fixture
def declared(monkeypatch):
    """Declare a new engine the way an engine module does, for the length of one test."""
    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))
    spec = EngineSpec("quick", "a test engine", needs_export=True, device="cpu", auto=(AutoRank(1, None, "fp32"),),
                      bench=(BenchRow(), BenchRow("int8", "int8", note="its int8 row")))
    registry.register(spec)(_Recorder)
    return spec


def test_a_declared_engine_joins_every_reader(declared):
    """Catches: a reader that keeps its own list of engines (a new engine would be unknown there)."""
    from layerscope.bench.engine_rows import bench_engines
    from layerscope.bench.runner import parse_engines
    from layerscope.engines.auto import pick_engine
    from layerscope.engines.base import check_engine_name, needs_export

    assert check_engine_name("quick") == "quick" and needs_export("quick")
    assert "quick" in registry.names_text()
    assert registry.auto_order(explicit_variant=False)[0] == ("quick", None, "fp32")
    assert parse_engines("quick,quick-int8") == ["quick", "quick-int8"]
    assert bench_engines()["quick-int8"].variant == "int8"
    from layerscope.model.manifest_type import Manifest

    handle = SimpleNamespace(manifest=Manifest.from_dict({
        "source": {"spec": "x"}, "family": "bert", "num_layers": 1, "hidden_size": 4,
        "parity": {"outputs": {"hidden_states.0": {"min_cos": 1.0}}}}))
    engine = pick_engine(handle, max_batch=8)
    assert isinstance(engine, _Recorder) and engine.options == {"max_batch": 8}
    assert engine.info.notes[0].startswith("auto picked quick (min cosine 1.000000")


def test_an_engine_that_picks_others_is_known_by_its_declaration_not_its_name(monkeypatch):
    """An engine declared with ``picks_engine`` (as auto is) takes --min-cosine and is not probed before a run
    (it tries the others in turn), whatever its name; one that does not pick is refused --min-cosine. Catches: a
    reader that keys on the name 'auto' instead of the declaration."""
    from layerscope.engines.base import create_engine
    from layerscope.errors import EngineUnavailableError
    from layerscope.export.open import require_engine
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest_type import Manifest

    class Chooser(_Recorder):
        @classmethod
        def probe(cls, export_dir=None):
            return False, "probed although it picks another engine"

    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))
    registry.register(EngineSpec("chooser", "picks among the others", needs_export=True, device="any",
                                 picks_engine=True))(Chooser)
    registry.register(EngineSpec("single", "one engine", needs_export=True, device="cpu"))(Chooser)
    handle = ModelHandle("x", Path("export"), Manifest.from_dict({"source": {"spec": "x"}, "family": "bert",
                                                                  "num_layers": 1, "hidden_size": 4}))
    require_engine("chooser")  # not probed
    assert create_engine("chooser", handle, min_cosine=0.9).options == {"min_cosine": 0.9}
    with pytest.raises(InputError, match="--min-cosine chooses among engines"):
        create_engine("single", handle, min_cosine=0.9)
    with pytest.raises(EngineUnavailableError, match="probed although"):
        require_engine("single")


def test_an_engine_starts_knowing_the_declaration_it_is_made_from(monkeypatch):
    """The declaration reaches the constructor: an engine made from a resolved choice reads that choice's
    declaration while it starts (not one looked up again by its name), auto hands back an engine carrying the
    picked engine's own declaration, and one made by its class directly finds its declaration by name.
    Catches: the declaration set on the engine only after it was made, or auto's handed to the engine it picks."""
    from dataclasses import replace

    from layerscope.engines.base import Engine, create_engine
    from layerscope.engines.registry import EngineChoice
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest_type import Manifest

    class Quick(Engine):
        name = "quick"

        def __init__(self, model, *, spec=None, **options):
            super().__init__(model, spec)
            self.starting = self.spec  # what its constructor reads (TorchEngine reads its precision there)

        def run(self, batch, layers, poolings):
            raise NotImplementedError

        def run_tokens(self, batch, layers):
            raise NotImplementedError

    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))
    registry.register(EngineSpec("quick", "a test engine", needs_export=True, device="cpu",
                                 auto=(AutoRank(1, None, "fp32"),)))(Quick)
    handle = ModelHandle("x", Path("export"), Manifest.from_dict({
        "source": {"spec": "x"}, "family": "bert", "num_layers": 1, "hidden_size": 4,
        "parity": {"outputs": {"hidden_states.0": {"min_cos": 1.0}}}}))
    registered = registry.engines()["quick"]
    choice = EngineChoice(replace(registered, pools_as_made=True))  # as a run resolved it: not the registry's
    engine = create_engine(choice, handle)
    assert engine.starting is choice.spec and engine.spec is choice.spec and engine.pools_as_made
    picked = create_engine("auto", handle)
    assert isinstance(picked, Quick) and picked.starting is registered and picked.spec is registered
    direct = Quick(handle)
    assert direct.starting is registered and not direct.pools_as_made


def test_unknown_engine_names_every_declared_one_and_the_closest():
    from layerscope.engines.base import check_engine_name

    with pytest.raises(InputError) as err:
        check_engine_name("orrt")
    assert "did you mean 'ort'" in str(err.value)
    assert all(name in str(err.value) for name in registry.engine_names())


def test_a_plain_model_reaches_an_export_engine_only_through_open_engine(tiny_model):
    """Catches: an engine that exports on its own again (the engines -> export circle)."""
    from layerscope.engines.base import create_engine

    with pytest.raises(InputError, match="open_engine"):
        create_engine("ort", str(tiny_model("bert")))


def test_cli_help_lists_every_engine_and_bench_row():
    """Catches: help strings that list engine names by hand (they went stale: 'ov' was missing from two)."""
    import typer

    from layerscope.cli import app

    command = typer.main.get_command(app)
    for name in ("extract", "run", "search"):
        opts = {p.name: p for p in command.commands[name].params}
        assert opts["engine"].help == registry.names_text() + "."
    bench_help = {p.name: p for p in command.commands["bench"].params}["engines"].help
    assert all(row in bench_help for row in registry.bench_rows())


def _engine_name_collections(tree: ast.AST, names: set[str]):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            found = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= 2:
                yield node.lineno, sorted(found)


def test_no_module_keeps_its_own_list_of_engine_names():
    """Catches: a second hand-written list of engines (a tuple, list or set naming two or more of them)."""
    names = set(registry.engine_names())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(SRC)}:{line} {hit}" for line, hit in _engine_name_collections(tree, names)]
    assert found == []


def _literal_names(node: ast.AST, names: set[str]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)} & names
    return set()


def _engine_name_checks(tree: ast.AST, names: set[str]):
    """Comparisons of an engine (an expression that says ``engine``) with an engine's name written out, and
    dicts keyed by two or more engine names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            written = set().union(*(_literal_names(side, names) for side in sides))
            about = [ast.unparse(side) for side in sides if not _literal_names(side, names)]
            if written and any("engine" in text.lower() for text in about):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)} & names
            if len(keys) >= 2:
                yield node.lineno, f"a dict keyed by {sorted(keys)}"


def test_the_name_check_scan_sees_what_it_looks_for():
    """The scan below flags each way a module has told engines apart by name, and not a name that only looks
    like one (a family's export path, a device)."""
    names = set(registry.engine_names())
    flagged = ['if run.engine.info.name == "torch": pass', 'x = spec.engine != "torch"',
               'needs = job["engine"] in ("ov", "ort")', 'ENGINES = {"auto": "ort", "ort": "ort", "ov": "ov"}',
               'if engine_name == "auto": pass']
    for code in flagged:
        assert list(_engine_name_checks(ast.parse(code), names)), code
    for code in ('if family.export_path == "torch": pass', 'on_gpu = device == "cuda"', 'x = {"auto": "auto"}'):
        assert not list(_engine_name_checks(ast.parse(code), names)), code


def test_no_module_outside_the_engines_tells_engines_apart_by_name():
    """Every fact about an engine (runs the attention graph, is the PyTorch reference, its runtime, the export
    variant a precision runs, whether it pools each layer as made) is a field of its declaration, so a new engine
    needs no edit outside engines/. Catches: ``ENGINES = {"auto": "ort", ...}``, ``if engine == "torch"``."""
    names = set(registry.engine_names())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] == "engines":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(SRC)}:{line} {hit}" for line, hit in _engine_name_checks(tree, names)]
    assert found == []


def test_the_declared_facts_give_todays_answers():
    """The facts that replaced the name checks answer as those checks did for every engine."""
    from layerscope.engines.registry import Runtime, attention_engine, engine_spec

    assert {n: attention_engine(n) for n in registry.engine_names()} == {
        "torch": "torch", "torch-fp16": None, "torch-bf16": None, "ort": "ort", "cuda": None, "trt": None,
        "ov": "ov", "auto": "ort"}
    assert attention_engine("nonesuch") is None
    assert [n for n, s in registry.engines().items() if s.reference] == ["torch"]
    assert {n: s.runtime for n, s in registry.engines().items()} == {
        "torch": Runtime.PYTORCH, "torch-fp16": Runtime.PYTORCH, "torch-bf16": Runtime.PYTORCH,
        "ort": Runtime.ONNXRUNTIME, "cuda": Runtime.ONNXRUNTIME, "trt": Runtime.ONNXRUNTIME,
        "ov": Runtime.OPENVINO, "auto": None}
    # the export variant a bench row must make first: ov's int8 precision runs the export's int8 graph
    ov, ort = engine_spec("ov"), engine_spec("ort")
    assert [ov.export_variant(v) for v in (None, "fp32", "bf16", "int8")] == [None, None, None, "int8"]
    assert [ort.export_variant(v) for v in (None, "int8", "int8-block", "gqa")] == [None, "int8", "int8-block", "gqa"]


def test_a_new_engine_that_runs_the_attention_graph_needs_no_other_edit(declared):
    from layerscope.engines.registry import Runtime, attention_engine
    from layerscope.export.attention_run import attention_engines, check_attention_engine

    registry.register(EngineSpec("seer", "reads attention", needs_export=True, device="cpu", attention=True,
                                 runtime=Runtime.ONNXRUNTIME))(_Recorder)
    assert attention_engine("seer") == "seer" and check_attention_engine("seer") == "seer"
    assert "seer" in attention_engines() and attention_engine("quick") is None


def test_reading_the_registry_loads_no_numpy_or_engine_library():
    """Catches: an engine module importing numpy, onnxruntime or torch at import time; the CLI reads the
    registry for its help, so that would slow every ``layerscope --help``."""
    import subprocess
    import sys

    code = ("import sys, layerscope.cli\nfrom layerscope.engines.registry import engines\nengines()\n"
            "print(sorted(m for m in ('numpy', 'torch', 'onnxruntime', 'openvino', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_gpu_libraries_are_preloaded_once_before_a_gpu_provider(monkeypatch):
    """Catches: a CUDA provider that cannot find libcudart/cuDNN from the nvidia-* pip packages because
    onnxruntime's preload_dlls was never called (it is not called by importing onnxruntime)."""
    from layerscope.engines import ort_session as ort_mod

    calls = []
    fake = SimpleNamespace(preload_dlls=lambda: calls.append(1),
                           get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_mod, "_PRELOADED", [])
    ort_mod.preload_gpu_libraries(fake)
    ort_mod.preload_gpu_libraries(fake)
    assert calls == [1]
    monkeypatch.setattr(ort_mod, "_PRELOADED", [])
    ort_mod.preload_gpu_libraries(SimpleNamespace())  # an older build without it: nothing to do
    assert ort_mod._PRELOADED == []
