"""benchmarks/gpu/pieces.py: files cut into loads that fit one device call come back byte-identical, and a
missing or damaged piece is one line naming the load to send again."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "pieces.py"


@pytest.fixture(scope="module")
def pieces():
    spec = importlib.util.spec_from_file_location("gpu_pieces", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"a.whl": 2500, "b.whl": 999, "empty.csv": 0, "c.whl": 1000}
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    return [src / n for n in sizes]


def test_split_receive_join_round_trip(pieces, tmp_path):
    files = _files(tmp_path)
    plan = pieces.split(files, tmp_path / "loads", piece_bytes=1000, load_bytes=1500)
    loads = sorted((tmp_path / "loads").glob("load-*"))
    assert len(loads) == plan["loads"] >= 3
    for load in loads:  # no load over its limit, plan.json in each
        assert sum(f.stat().st_size for f in load.iterdir() if f.name != "plan.json") <= 1500
        assert json.loads((load / "plan.json").read_text()) == plan
    assert [len(f["pieces"]) for f in plan["files"]] == [3, 1, 1, 1]
    for load in loads:
        pieces.receive(load, tmp_path / "far")
    made = pieces.join(tmp_path / "far", tmp_path / "wheels")
    assert [m.name for m in made] == [f.name for f in files]
    for f in files:
        assert (tmp_path / "wheels" / f.name).read_bytes() == f.read_bytes()


def test_missing_and_damaged_pieces_name_the_load(pieces, tmp_path):
    files = _files(tmp_path)
    plan = pieces.split(files, tmp_path / "loads", piece_bytes=1000, load_bytes=1500)
    for load in sorted((tmp_path / "loads").glob("load-*"))[1:]:  # load-1 never arrives
        pieces.receive(load, tmp_path / "far")
    first = plan["files"][0]["pieces"][0]
    assert first["load"] == 1
    (tmp_path / "far" / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(SystemExit, match=r"a.whl.part000 of a.whl is missing or cut: send load-1 again"):
        pieces.join(tmp_path / "far", tmp_path / "wheels")
    pieces.receive(tmp_path / "loads" / "load-1", tmp_path / "far")
    victim = tmp_path / "far" / "b.whl.part000"
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    load_b = plan["files"][1]["pieces"][0]["load"]
    with pytest.raises(SystemExit, match=rf"b.whl does not match its sha256 once joined: send load-{load_b} again"):
        pieces.join(tmp_path / "far", tmp_path / "wheels")


def test_a_piece_larger_than_a_load_is_refused(pieces, tmp_path):
    with pytest.raises(SystemExit, match="must fit in a load"):
        pieces.split(_files(tmp_path), tmp_path / "loads", piece_bytes=2000, load_bytes=1500)


def test_files_that_arrived_are_joined_while_the_rest_travel(pieces, tmp_path):
    files = _files(tmp_path)
    plan = pieces.split(files, tmp_path / "loads", piece_bytes=1000, load_bytes=1500)
    last = max(p["load"] for p in plan["files"][0]["pieces"])  # a.whl spans loads 1..last
    for load in sorted((tmp_path / "loads").glob("load-*"))[:last]:
        pieces.receive(load, tmp_path / "far")
    made = pieces.join(tmp_path / "far", tmp_path / "wheels", only="a.*")
    assert [m.name for m in made] == ["a.whl"] and made[0].read_bytes() == files[0].read_bytes()
    waiting = [f["name"] for f in plan["files"] if max(p["load"] for p in f["pieces"]) > last]
    assert waiting, "the test needs a file still travelling"
    with pytest.raises(SystemExit, match="send load-"):
        pieces.join(tmp_path / "far", tmp_path / "wheels", skip="a.*")


def test_parity_table_names_every_layer_and_engine(tmp_path):
    import importlib.util as iu

    spec = iu.spec_from_file_location("gpu_parity", SCRIPT.with_name("parity.py"))
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    record = {"export": "x", "reference": "torch fp32", "engines": {
        "cuda": {"layers": {"raw": {"min_cos": 1.0, "max_abs": 0.0}, "1": {"min_cos": 0.99999, "max_abs": 0.002}}},
        "trt": {"error": "no TensorRT"}}}
    lines = mod.table([record]).splitlines()
    assert "| layer | cuda |" in lines and "| 1 | 0.9999900 / 0.002 |" in lines and "- trt: no TensorRT" in lines


def test_the_cli_starts_with_a_typer_that_has_no_flag_type_hook(monkeypatch):
    """The GPU machine's typer has no ``display_type_rich``; layerscope's CLI must still start there."""
    import typer.core

    import layerscope.cli.root as root

    class BareOption:  # a typer.core.TyperOption without the hook
        pass

    monkeypatch.setattr(typer.core, "TyperOption", BareOption)
    root._flags_show_no_type()
    assert not hasattr(BareOption, "display_type_rich")
