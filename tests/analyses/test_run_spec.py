"""A run is what its RunSpec says: every setting that changes the figures (max length, engine as picked,
options) is part of its identity and folder; follow-up runs with other settings get their own folder;
behind --out a different run is refused naming each key that differs; a typo is reported before any
folder conflict; the vector cache keeps the run's max length and batch size even when its store is locked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("spec-home")  # one export cache for the module's runs


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch, home):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(home))


def long_pairs(path: Path, n: int = 24, words: int = 60, seed: int = 3) -> Path:
    """Scored pairs whose sentences run well past 32 tokens, differing only after their first words."""
    rng = np.random.default_rng(seed)
    vocab = "the a cat dog man woman child plays runs sits reads eats on in near park house".split()
    lines = ["sentence1\tsentence2\tscore"]
    for i in range(n):
        head = list(rng.choice(vocab, size=4))
        a = head + list(rng.choice(vocab, size=words))
        b = head + list(rng.choice(vocab, size=words))
        lines.append(f"{' '.join(a)}\t{' '.join(b)}\t{round(float(rng.uniform(0, 5)), 1)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli(args, capsys) -> tuple[int, str]:
    code, text = run_cli(args, capsys)
    return code, " ".join(text.split())  # rich wraps long lines


def sts(model, data, *extra):
    return ["run", "sts", "--model", model, "--data", data, "--layers", "-1", "--pooling", "mean",
            "--n-boot", "0", "--engine", "torch", *extra]


def runs_of(analysis: str) -> dict[str, dict]:
    """Each run folder of ``analysis`` under the default results root, with its results."""
    return {p.parent.name: json.loads(p.read_text()) for p in Path("results").glob(f"*/*/{analysis}/*/results.json")}


def only(per_model: dict):
    (value,) = per_model.values()
    return value


def test_max_length_is_part_of_the_run(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv")
    code, text = cli(sts(model, data, "--max-length", "32"), capsys)
    assert code == 0 and "wrote" in text, text
    code, text = cli(sts(model, data, "--max-length", "128"), capsys)
    assert code == 0 and "wrote" in text and "reused" not in text, text
    runs = runs_of("sts")
    assert len(runs) == 2
    by_len = {r["settings"]["max_length"]: r for r in runs.values()}
    assert set(by_len) == {32, 128}
    rows = {k: only(r["per_model"])["tables"]["layers"][0]["mean_similarity"] for k, r in by_len.items()}
    assert rows[32] != rows[128]  # truncated at 32 tokens the pairs look alike: other figures
    code, text = cli(sts(model, data, "--max-length", "32"), capsys)
    assert code == 0 and "reused" in text, text  # the same spec again: reused


def test_auto_records_what_it_picked(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    args = [a if a != "torch" else "auto" for a in sts(model, data)]
    code, text = cli(args, capsys)
    assert code == 0, text
    (results,) = runs_of("sts").values()
    ran = only(results["models"])["engine"]["engine"]
    assert ran != "auto"
    assert results["settings"]["engine"] == "auto" and results["settings"]["engines_resolved"] == [ran]
    assert results["identity"]["model.engine"] == ran


def test_follow_ups_with_another_engine_or_probe_get_their_own_folder(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=16, words=5)
    train = long_pairs(tmp_path / "train.tsv", n=16, words=5, seed=4)
    ort = [a if a != "torch" else "ort" for a in sts(model, data)]
    assert cli(ort, capsys)[0] == 0
    code, text = cli(sts(model, data), capsys)  # torch after ort: not refused, not reused
    assert code == 0 and "wrote" in text, text
    code, text = cli(sts(model, data, "--probe", "--train", train, "--probe-kind", "cosine-mlp",
                         "--probe-epochs", "2"), capsys)
    assert code == 0 and "wrote" in text, text
    runs = list(runs_of("sts").values())
    assert len(runs) == 3
    assert sorted(r["settings"]["engine"] for r in runs) == ["ort", "torch", "torch"]
    assert sorted(r["settings"]["options"]["probe"] for r in runs) == [False, False, True]
    assert [("probe" in only(r["per_model"])) for r in runs].count(True) == 1


def test_out_with_another_spec_names_each_differing_key(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    assert cli(sts(model, data, "--out", "r", "--max-length", "32"), capsys)[0] == 0
    saved = Path("r/results.json").read_text()
    code, text = cli(sts(model, data, "--out", "r", "--max-length", "64", "--seed", "2"), capsys)
    assert code == 2, text
    assert "max_length 32 -> 64" in text and "seed 0 -> 2" in text, text
    assert "'n_boot'" not in text and "options={" not in text  # the keys that differ, not the whole dict
    assert len([line for line in text.splitlines() if line.strip()]) == 1
    assert Path("r/results.json").read_text() == saved


def test_pooling_typo_is_shown_before_a_folder_conflict(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    assert cli(sts(model, data, "--out", "r"), capsys)[0] == 0
    code, text = cli(sts(model, data, "--out", "r", "--seed", "5", "--pooling", "meen"), capsys)
    assert code == 2 and "unknown pooling 'meen'" in text and "did you mean 'mean'" in text, text
    assert "holds" not in text


def test_older_results_still_open_and_say_how_to_upgrade(tiny_model, tmp_path, capsys):
    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    assert cli(sts(model, data, "--out", "r"), capsys)[0] == 0
    doc = json.loads(Path("r/results.json").read_text())
    for key in ("format", "spec", "spec_hash"):
        doc.pop(key)
    Path("r/results.json").write_text(json.dumps(doc))  # as an older layerscope wrote it,
    Path("r/.layerscope.json").unlink()  # which recorded no files
    code, text = cli(["report", "r"], capsys)
    assert code == 0 and "re-rendered" in text, text
    code, text = cli(sts(model, data, "--out", "r"), capsys)
    assert code == 2 and "older layerscope" in text and "mv r r-old" in text, text
    # --force never deletes a folder whose files were not recorded as layerscope's: it says so
    code, text = cli(sts(model, data, "--out", "r", "--force"), capsys)
    assert code == 2 and "older layerscope" in text and Path("r/results.json").is_file(), text
    Path("r").rename("r-old")
    assert cli(sts(model, data, "--out", "r"), capsys)[0] == 0
    assert json.loads(Path("r/results.json").read_text())["format"] >= 1


def test_locked_cache_store_keeps_max_length_and_batch_tokens(monkeypatch):
    """When another run holds the cache store, the vectors are computed in memory with the run's settings."""
    from types import SimpleNamespace

    import layerscope.extraction.pipeline as pipeline
    from layerscope.analyses import cache
    from layerscope.store.store_lock import StoreLockedError

    seen = {}

    def locked(*args, **kwargs):
        raise StoreLockedError("held by another run")

    def embed(handle, texts, **kwargs):
        seen.update(kwargs)
        return {}

    monkeypatch.setattr(pipeline, "extract", locked)
    monkeypatch.setattr(pipeline, "embed", embed)
    info = SimpleNamespace(name="torch", provider="torch-cpu", precision="fp32")
    from layerscope.model.manifest_type import Manifest

    manifest = Manifest.from_dict({"source": {"spec": "k"}, "family": "bert", "num_layers": 2, "hidden_size": 4,
                                   "max_length": 128})
    handle = SimpleNamespace(key="k", manifest=manifest, trust_remote_code=False)
    run = SimpleNamespace(handle=handle, engine=SimpleNamespace(info=info, depth=None))
    cache.cached_vectors(run, ["a text"], layers=["2"], poolings=["mean"], max_length=24, batch_tokens=512)
    assert seen["max_length"] == 24 and seen["batch_tokens"] == 512


def test_run_returns_its_outcome_and_leaves_the_context_alone(tiny_model, tmp_path):
    """run_analysis hands back whether it reused (no flag set on the caller's request, which it never changes),
    and still unpacks as (dir, results)."""
    import dataclasses

    from layerscope.analyses.base import RunRequest, run_analysis

    data = long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", layers="-1", poolings=["mean"], data=str(data),
                     out=tmp_path / "out", options={"n_boot": 0}, cache=False)
    before = dataclasses.asdict(ctx)
    first = run_analysis("sts", ctx)
    second = run_analysis("sts", ctx)
    assert (first.reused, second.reused) == (False, True)
    out, results = second
    assert out == tmp_path / "out" and results["spec_hash"] == first.results["spec_hash"] == first.spec.hash
    assert dataclasses.asdict(ctx) == before


def test_an_older_default_folder_says_how_to_upgrade(tiny_model, tmp_path, capsys):
    """A result of the older layout (results.json right in the analysis folder) is never silently nested into."""
    import shutil

    model, data = tiny_model("bert"), long_pairs(tmp_path / "pairs.tsv", n=8, words=5)
    assert cli(sts(model, data), capsys)[0] == 0
    (run,) = [p.parent for p in Path("results").glob("*/*/sts/*/results.json")]
    for f in run.iterdir():  # lay it out as an older layerscope did: results/<model>/<rev>/sts/results.json
        shutil.move(str(f), str(run.parent / f.name))
    run.rmdir()
    (run.parent / "runs.md").unlink()
    code, text = cli(sts(model, data), capsys)
    assert code == 2 and f"mv {run.parent} {run.parent}-old" in text and "layerscope report" in text, text
    assert cli(["report", run.parent], capsys)[0] == 0  # it still opens
