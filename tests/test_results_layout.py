"""inspect run keeps runs apart (results/<model>/<revision>/<analysis>/<spec hash>/), reuses a run it already
has, never overwrites a different run without --force, and never deletes the user's files beside the results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_helpers import run_cli


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def two_models(tiny_model, tmp_path_factory):
    """The tiny bert and a copy of it with other weights (a retrained model, same name)."""
    import torch
    from transformers import AutoModel

    base = tmp_path_factory.mktemp("layout") / "mybert"
    shutil.copytree(tiny_model("bert"), base)
    other = tmp_path_factory.mktemp("layout-other") / "mybert"
    shutil.copytree(tiny_model("bert"), other)
    net = AutoModel.from_pretrained(other)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    net.save_pretrained(other, safe_serialization=True)
    return base, other


def cli(args, capsys) -> tuple[int, str]:
    code, text = run_cli(args, capsys)
    return code, " ".join(text.split())  # rich wraps long lines


RUN = ["run", "compositionality", "--engine", "torch", "--layers", "-1", "--no-cache"]


def weights_prefix(model_dir: Path) -> str:
    from layerscope.model.source import ModelSource, weights_hash

    return weights_hash(ModelSource(str(model_dir), str(model_dir), True, None))[:12]


def only_run(analysis_dir: Path) -> Path:
    """The one run folder (``<spec hash>/``) under an analysis folder."""
    runs = [p.parent for p in analysis_dir.glob("*/results.json")]
    assert len(runs) == 1, runs
    assert runs[0].name == json.loads((runs[0] / "results.json").read_text())["spec_hash"]
    return runs[0]


def test_default_layout_keeps_models_and_weights_apart(two_models, tmp_path, capsys):
    base, other = two_models
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0, text
    first = only_run(Path("results") / "mybert" / weights_prefix(base) / "compositionality")
    assert (first / "results.json").exists() and (first / ".layerscope.json").exists(), text
    assert first.name in (first.parent / "runs.md").read_text()  # the readable index of the runs
    code, text = cli(RUN + ["--model", other], capsys)
    assert code == 0, text
    second = only_run(Path("results") / "mybert" / weights_prefix(other) / "compositionality")
    assert second != first and (second / "results.json").exists()
    assert (first / "results.json").exists()  # the earlier model's results are still there
    a = json.loads((first / "results.json").read_text())["per_model"]
    b = json.loads((second / "results.json").read_text())["per_model"]
    assert a != b
    # two models side by side: names and revisions joined with '+'
    code, text = cli(RUN + ["--model", base, "--model", other], capsys)
    assert code == 0, text
    both = only_run(Path("results") / "mybert+mybert" / f"{weights_prefix(base)}+{weights_prefix(other)}"
                    / "compositionality")
    assert (both / "results.json").exists()
    # inspect report still works on the new layout
    code, text = cli(["report", both], capsys)
    assert code == 0 and "re-rendered" in text


def test_same_run_is_reused_and_recompute_runs_it_again(two_models, capsys):
    base, _ = two_models
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0 and "wrote" in text
    path = next(Path("results").rglob("results.json"))
    saved = path.read_text()
    stamp = path.stat().st_mtime_ns
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0 and "already holds this result" in text and "reused" in text, text
    assert "mean win rate (diff)" in text  # the summary is printed from the saved results.json
    assert path.stat().st_mtime_ns == stamp and path.read_text() == saved
    code, text = cli(RUN + ["--model", base, "--recompute"], capsys)
    assert code == 0 and "wrote" in text
    assert json.loads(path.read_text())["created"] >= json.loads(saved)["created"]
    assert path.stat().st_mtime_ns != stamp


def test_other_options_get_their_own_folder_or_are_refused_behind_out(two_models, capsys):
    base, _ = two_models
    assert cli(RUN + ["--model", base], capsys)[0] == 0
    path = next(Path("results").rglob("results.json"))
    saved = path.read_text()
    code, text = cli(RUN[:-3] + ["--layers", "0", "--no-cache", "--model", base], capsys)
    assert code == 0 and "wrote" in text, text  # another spec: its own folder beside the first
    assert path.read_text() == saved
    runs = sorted(p.parent.name for p in path.parent.parent.glob("*/results.json"))
    assert len(runs) == 2 and all(r in (path.parent.parent / "runs.md").read_text() for r in runs)
    # behind an explicit --out: refused, naming the key that differs with its old and new value
    assert cli(RUN + ["--model", base, "--out", "r"], capsys)[0] == 0
    saved = Path("r/results.json").read_text()
    code, text = cli(RUN[:-3] + ["--layers", "0", "--no-cache", "--model", base, "--out", "r"], capsys)
    assert code == 2 and "differs in layers '-1' -> '0'" in text and "--out" in text and "--force" in text, text
    assert Path("r/results.json").read_text() == saved
    code, text = cli(RUN[:-3] + ["--layers", "0", "--no-cache", "--model", base, "--out", "r", "--force"], capsys)
    assert code == 0, text
    assert json.loads(Path("r/results.json").read_text())["settings"]["layers"] == "0"


def test_user_files_beside_results_are_never_deleted(two_models, capsys):
    base, _ = two_models
    assert cli(RUN + ["--model", base], capsys)[0] == 0
    out = next(Path("results").rglob("results.json")).parent
    (out / "notes.md").write_text("what I think of layer 2")
    for extra in (["--recompute"], ["--force"], ["--layers", "0", "--force", "--out", out]):
        code, text = cli(RUN + ["--model", base] + extra, capsys)
        assert code == 2 and "notes.md" in text and "layerscope did not make" in text, text
        assert (out / "notes.md").read_text() == "what I think of layer 2"
    # the same run is still reused (nothing is written, so nothing is at risk)
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0 and "reused" in text


def test_changed_data_file_is_not_reused(two_models, tmp_path, capsys):
    from layerscope.data.items import read_items

    base, _ = two_models
    items = Path("items.jsonl")
    from layerscope.data.items import default_items_path

    src = default_items_path()
    lines = src.read_text(encoding="utf-8").splitlines()
    items.write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    assert len(read_items(str(items))) == 20
    assert cli(RUN + ["--model", base, "--data", items, "--out", "r"], capsys)[0] == 0
    code, text = cli(RUN + ["--model", base, "--data", items.resolve(), "--out", "r"], capsys)
    assert code == 0 and "reused" in text  # the same file named another way is the same data
    items.write_text("\n".join(lines[:24]) + "\n", encoding="utf-8")
    code, text = cli(RUN + ["--model", base, "--data", items, "--out", "r"], capsys)
    assert code == 2 and "differs in data" in text, text
    code, text = cli(RUN + ["--model", base, "--data", items, "--out", "r", "--recompute"], capsys)
    assert code == 2  # --recompute reruns the same run; a different one needs --force
    assert cli(RUN + ["--model", base, "--data", items, "--out", "r", "--force"], capsys)[0] == 0


@pytest.mark.parametrize("garble, figures", [({"settings": [1]}, False),
                                             ({"settings": {"options": [1], "poolings": 7}}, False),
                                             ({"per_model": {"mybert": {"layers": "x"}}}, True),
                                             ({"combined": [1]}, True), ({"per_model": {"mybert": []}}, True)])
def test_a_garbled_reused_results_json_is_one_line(garble, figures, two_models, capsys):
    """A results.json edited into fields its summary or the runs index cannot read: never an internal error;
    where the figures themselves are garbled, refused in one line naming the file, or run again."""
    base, _ = two_models
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0 and "wrote" in text
    path = next(Path("results").rglob("results.json"))
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, **garble}))
    from layerscope.owned_record import record

    record(path.parent, "result", names=["results.json"])  # a record that agrees: the file is read, not refused
    code, text = cli(RUN + ["--model", base], capsys)
    assert "internal error" not in text and "Traceback" not in text, text
    assert code in (0, 2) and (code == 0 or "results.json" in text), text
    if figures:
        assert (code == 2 and "garbles" in text) or (code == 0 and "wrote" in text and "reused" not in text), text


def test_runs_md_that_is_a_folder_is_one_line_before_the_work(two_models, capsys):
    base, _ = two_models
    code, text = cli(RUN + ["--model", base], capsys)
    assert code == 0 and "wrote" in text
    index = next(Path("results").rglob("runs.md"))
    index.unlink()
    index.mkdir()
    (index / "mine.txt").write_text("a user's file", encoding="utf-8")
    for extra in ([], ["--recompute"]):
        code, text = cli(RUN + ["--model", base, *extra], capsys)
        assert code == 2 and "runs.md is not a file" in text and "internal error" not in text, text
    assert (index / "mine.txt").read_text(encoding="utf-8") == "a user's file"
