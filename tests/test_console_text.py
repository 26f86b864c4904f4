"""Text from data, models, paths and hints reaches the console exactly as it is: never read as Rich markup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_helpers import cli_output

TEXT = "A man plays the [red]guitar[/red] on stage [citation needed]."
HINT = "pip install 'layerscope[openvino]'"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def bracket_store(bert_export, tmp_path_factory):
    from layerscope.extraction.pipeline import extract

    root = tmp_path_factory.mktemp("brackets")
    corpus = root / "c.txt"
    corpus.write_text(f"{TEXT}\nA cat sat on the mat.\nThe [b]train[/b] leaves at noon.\n", encoding="utf-8")
    store = root / "[red]store"
    extract(bert_export, str(corpus), store, engine="ort", layers="-1", poolings=["mean"])
    return store


def test_search_prints_stored_texts_and_queries_exactly(bracket_store, capsys):
    idx = bracket_store.parent / "[b]idx [citation needed]"
    code, out, err = cli_output(["index", "build", "--store", bracket_store, "--out", idx, "--layer", "-1",
                                 "--device", "cpu"], capsys)
    assert code == 0, err
    assert str(idx) in flat(out)
    code, out, err = cli_output(["search", "--index", idx, "-k", "3", "--engine", "ort", "--device", "cpu",
                                 "[red]guitar[/red] [citation needed]"], capsys)
    assert code == 0, err
    assert TEXT in flat(out), out
    assert "[red]guitar[/red] [citation needed]" in flat(out)


def test_engines_prints_hints_exactly(capsys, monkeypatch):
    from layerscope.engines import ort_packages as packages_mod
    from layerscope.engines import probe as probe_mod
    from layerscope.engines.probe import EngineStatus

    monkeypatch.setattr(probe_mod, "probe_all", lambda model=None: [EngineStatus("ov", False, HINT)])
    real = packages_mod.ort_packages

    def with_warning():
        info = real()
        info.warnings.append(f"try {HINT}")
        return info

    monkeypatch.setattr(packages_mod, "ort_packages", with_warning)
    code, out, err = cli_output(["engines"], capsys)
    assert code == 0, err
    assert HINT in flat(out) and f"try {HINT}" in flat(out), out


def test_extract_summary_prints_paths_and_warnings_exactly(bert_export, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a cat"}\n{"text": ""}\n', encoding="utf-8")
    out_dir = tmp_path / "[red]s"
    code, out, err = cli_output(["extract", "--model", bert_export, "--input", corpus, "--out", out_dir,
                                 "--engine", "ort", "--layers", "-1"], capsys)
    assert code == 0, err
    assert str(out_dir) in flat(out), out
    assert "extracted 2 texts" in out


def test_run_prints_model_names_and_paths_exactly(bert_export, tmp_path, capsys):
    model = tmp_path / "[red]bert [citation needed]"
    shutil.copytree(bert_export, model)
    result = tmp_path / "[b]result"
    code, out, err = cli_output(["run", "compositionality", "--model", model, "--engine", "ort", "--layers", "-1",
                                 "--no-cache", "--out", result], capsys)
    assert code == 0, err
    text = flat(out)
    assert str(result) in text, out
    assert "[red]bert [citation needed]" in text, out


def test_cache_list_prints_model_names_exactly(capsys, monkeypatch):
    import layerscope.cachedir as cachedir
    from layerscope.cachedir import Entry

    long_name = "some-organisation-with-a-long-name/[red]model[/red]-[citation needed]-v2-instruct-extra-long"
    entry = Entry("exports", Path("/tmp/x/[b]entry"), long_name, 1024, 1.0, "0.1")
    monkeypatch.setattr(cachedir, "scan", lambda: ([entry], []))
    code, out, err = cli_output(["cache", "list"], capsys)
    assert code == 0, err
    assert long_name in out, out  # on one line: a model name is never cut or wrapped
    assert "[b]entry" in flat(out)


def test_errors_and_interruptions_print_their_text_exactly(capsys):
    import layerscope.cli as cli
    from layerscope.errors import InputError, Interrupted

    def bad():
        raise InputError(f"the column [citation needed] is missing; {HINT}")

    def stopped():
        raise Interrupted("kept 3 rows of [red]store[/red]; re-run with --resume")

    cli.app.command("bad-for-test")(bad)
    cli.app.command("stopped-for-test")(stopped)
    code, out, err = cli_output(["bad-for-test"], capsys)
    assert code == 2 and f"the column [citation needed] is missing; {HINT}" in flat(err), err
    code, out, err = cli_output(["stopped-for-test"], capsys)
    assert code == 130 and "kept 3 rows of [red]store[/red]" in flat(err), err


def test_autos_choice_is_one_line_and_its_reasons_come_with_verbose(bert_export, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat\na dog\n")
    code, out, err = cli_output(["extract", "--model", bert_export, "--input", corpus, "--out", tmp_path / "s",
                                 "--layers", "-1"], capsys)
    assert code == 0, err
    (note,) = [line for line in out.splitlines() if line.startswith("auto picked")]
    assert "passed over (layerscope -v ... says why)" in note and "accuracy not recorded" not in out
    assert len(note) <= 120  # one line of a terminal
    code, out, err = cli_output(["-v", "extract", "--model", bert_export, "--input", corpus, "--out",
                                 tmp_path / "s2", "--layers", "-1"], capsys)
    assert code == 0, err
    assert "passed over" in out and "not recorded" in flat(out)


@pytest.mark.parametrize("command", [["export", "--help"], ["extract", "--help"], ["run", "sts", "--help"],
                                     ["--help"]])
def test_help_shows_no_value_type_for_flags(command, capsys):
    code, out, err = cli_output(command, capsys)
    assert code == 0, err
    assert "--force" in out or "--debug" in out or "--probe" in out
    assert "<bool>" not in out and "BOOLEAN" not in out, out
    if command != ["--help"]:
        assert "<int>" in out or "<text>" in out or "<path>" in out  # options that take a value keep their type


def test_similarity_says_when_it_runs_on_generated_pairs(tiny_model, tmp_path, capsys):
    code, out, err = cli_output(["run", "similarity", "--model", tiny_model("bert"), "--engine", "torch", "--n", "8",
                                 "--no-cache", "--out", tmp_path / "s"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "no --data or --store given: comparing layers on 8 texts of generated zh-en problems, English" in text, out


def _commands(group, path=()):
    import click

    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def test_every_help_text_with_brackets_is_shown_whole(capsys, monkeypatch):
    """Help text in square brackets (``layerscope[ray]``, ``[default]``) is text, not Rich markup: walk every
    command and find each option's help, brackets included, in its --help."""
    import re

    import typer.main

    from layerscope.cli import app

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("TERMINAL_WIDTH", "400")
    checked = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        wanted = [p.help for p in cmd.params if p.help and re.search(r"\[[^\]]*\]", p.help)]
        if not wanted:
            continue
        code, out, err = cli_output([*path, "--help"], capsys)
        assert code == 0, err
        shown = flat(re.sub(r"[│╭╮╰╯─]", " ", out))
        for text in wanted:
            from rich.markup import render

            plain = render(text).plain  # what the text says once its escapes are read
            assert flat(plain) in shown, (path, plain)
            checked += 1
    assert checked >= 1
    code, out, err = cli_output(["extract", "--help"], capsys)
    assert "layerscope[ray]" in flat(re.sub(r"[│╭╮╰╯─]", " ", out))
