"""The documented command is ``layerscope``; ``inspect`` is named once, as its alias (issue 12)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]
# `inspect` followed by a subcommand, as a command line or inline code would show it
COMMAND = re.compile(r"(?:^|[`\s(])inspect (?:export|engines|extract|run|analyses|report|verify|index|search|cache|"
                     r"bench|optimize|export-store)\b")


def test_readme_shows_layerscope_commands_only():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    offending = [line for line in text.splitlines() if COMMAND.search(line)]
    assert offending == []
    assert "layerscope run sts" in text
    alias_paragraphs = [par for par in text.split("\n\n") if "`inspect`" in par]
    assert len(alias_paragraphs) == 1 and "alias" in alias_paragraphs[0]


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["report", "--help"], ["verify", "--help"],
                                  ["index", "build", "--help"], ["search", "--help"], ["optimize", "--help"],
                                  ["analyses"]])
def test_help_texts_say_layerscope(args, capsys):
    code, out, err = cli_output(args, capsys)
    assert code == 0, err
    text = " ".join((out + err).split())  # rich wraps help text across lines and boxes
    text = re.sub(r"[│╭╮╰╯─]", " ", text)
    assert not COMMAND.search(" ".join(text.split())), text
