"""``layerscope bench --depths``: each depth benches the engine rows at layers 0..d, and the figures per row
are its own texts/s, ms per text and speed-up against every layer, as computed here by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from layerscope.bench import sweep
from layerscope.bench.isolated import IsolatedConfig
from layerscope.errors import InputError


def test_parse_depths():
    assert sweep.parse_depths("3,0,all,1,-1", 6) == [0, 1, 3, 6]
    assert sweep.parse_depths("-2", 6) == [5]
    for bad, says in [("7", "layers are 0..6"), ("x", "not 'x'"), (",", "names no layer")]:
        with pytest.raises(InputError, match=says):
            sweep.parse_depths(bad, 6)


def test_sweep_runs_each_depth_and_figures_by_hand(monkeypatch):
    import layerscope.bench.isolated as isolated
    import layerscope.export.open as open_mod

    asked = []
    speeds = {"0:0": {"ort": 800.0, "ov": 1000.0}, "0:2": {"ort": 400.0, "ov": 500.0},
              "0:6": {"ort": 200.0, "ov": 250.0}}

    def fake(cfg):
        asked.append((cfg.layers, tuple(cfg.peers), cfg.sts))
        results = [{"engine": k, "kind": "engine", "available": True, "texts_per_s": v}
                   for k, v in speeds[cfg.layers].items()]
        results.append({"engine": "hf-eager", "kind": "baseline", "available": True, "texts_per_s": 100.0})
        return {"results": results, "machine": {"load": 0}}

    monkeypatch.setattr(isolated, "run_isolated", fake)
    monkeypatch.setattr(open_mod, "ensure_export",
                        lambda m, **kw: SimpleNamespace(manifest=SimpleNamespace(num_layers=6)))
    cfg = IsolatedConfig(model="m", engines=["ort", "ov"], texts=["a"] * 10, corpus="c", peers=["st-onnx"],
                         sts="sts.csv")
    got = sweep.run_sweep(cfg, "all,0,2")
    assert asked == [("0:0", (), None), ("0:2", (), None), ("0:6", (), None)]
    by_depth = {r["depth"]: r for r in got["depths"]}
    assert by_depth[0]["ms_per_text"] == {"ort": 1.25, "ov": 1.0}  # 1000 / 800, 1000 / 1000
    assert by_depth[0]["x_faster_than_all"] == {"ort": 4.0, "ov": 4.0}  # 800 / 200, 1000 / 250
    assert by_depth[2]["x_faster_than_all"] == {"ort": 2.0, "ov": 2.0}
    assert by_depth[6]["layers"] == 7 and "hf-eager" not in by_depth[6]["texts_per_s"]
    table = sweep.sweep_table(got)
    assert "| ort | 0 | 1 | 1.250 | 800.0 | 4.00 |" in table
    assert "| ov | 6 | 7 | 4.000 | 250.0 | 1.00 |" in table
