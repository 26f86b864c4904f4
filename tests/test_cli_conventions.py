"""What a command-line tool is expected to have: --version, shell completion, typed package data, docstrings on the
Python entry points, a pointer from a likely wrong command to the right one, copy-paste text kept whole in a pipe,
optional packages named with their extra, and an export the next run reuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hang_guard import HANG_S
from cli_helpers import cli_output, one_error

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys):
    import layerscope

    code, out, err = cli_output(["--version"], capsys)
    assert (code, out.strip(), err) == (0, f"layerscope {layerscope.__version__}", "")


def test_shell_completion_completes_command_names():
    env = dict(os.environ, _LAYERSCOPE_COMPLETE="complete_bash", COMP_WORDS="layerscope ex", COMP_CWORD="1")
    out = subprocess.run([sys.executable, "-m", "layerscope"], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    assert {"export", "extract", "export-store", "extract-images"} <= set(out.stdout.split())


def test_the_package_says_it_is_typed():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["layerscope"]
    assert "py.typed" in data
    assert (ROOT / "src" / "layerscope" / "py.typed").is_file()


def test_the_python_entry_points_say_what_they_do():
    import layerscope
    from layerscope import LayerStore

    for fn in (LayerStore.open, layerscope.open, layerscope.extract, layerscope.embed):
        assert fn.__doc__ and len(fn.__doc__.split()) >= 8, fn
    assert "allow_incomplete" in LayerStore.open.__doc__ and "StoreError" in LayerStore.open.__doc__


def test_index_search_points_to_the_search_command(capsys):
    code, out, err = cli_output(["index", "search", "--index", "stores/c/index-flat-st-m1", "a cat"], capsys)
    one_error(code, out + err, "layerscope search --index stores/c/index-flat-st-m1 'a cat'")


def test_a_line_printed_into_a_pipe_is_never_broken(capsys):
    """A path or a command to copy longer than the pipe's 120 columns reaches the pipe as one line (Rich broke it
    mid-token)."""
    from layerscope.cli.common import console, err_console, progress_printer

    hint = "layerscope extract --resume --out " + "/very/long/folder" * 12 + "/store"
    console().print(f"[bold green]wrote[/bold green] {hint}")
    progress_printer(console())(hint)
    err_console().print(f"[yellow]interrupted[/yellow]: {hint}")
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"wrote {hint}", f"- {hint}"]
    assert out.err.splitlines() == [f"interrupted: {hint}"]


def test_the_built_in_digits_name_the_extra_that_installs_scikit_learn(monkeypatch):
    from layerscope.analyses.crossmodal import digit_pairs
    from layerscope.errors import MissingExtraError

    for name in ("sklearn", "sklearn.datasets"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtraError, match=r"pip install 'layerscope\[images\]'"):
        digit_pairs(8)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("scikit-learn") for r in extras["images"])


def test_an_export_into_the_cache_is_the_one_the_next_run_reads(tiny_model, tmp_path, monkeypatch, capsys):
    """The quickstart's export is reused: ``layerscope export MODEL --cache`` makes the entry ``run``/``extract``
    ``--model MODEL`` read, which then exports nothing."""
    from layerscope.export import exporter
    from layerscope.export.open import ensure_export

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    model = str(tiny_model("bert"))
    code, out, err = cli_output(["export", model, "--cache", "--no-cpu-precisions"], capsys)
    assert code == 0, out + err
    made = [p for p in (tmp_path / "home" / "exports").iterdir() if p.is_dir()]
    assert len(made) == 1 and str(made[0].name) in " ".join(out.split()).replace(" ", "")

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(exporter, "export_model", no_export)
    assert ensure_export(model).export_dir == made[0].resolve()
    code, out, err = cli_output(["export", model, "--cache", "--out", str(tmp_path / "x")], capsys)
    one_error(code, out + err, "--cache and --out do not go together")
    script = (ROOT / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    assert '"$bin/layerscope" export minilm --cache' in script and "extract --model minilm" in script
