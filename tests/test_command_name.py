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


def test_messages_in_the_code_name_layerscope():
    """Error lines and notes tell the user to run `layerscope ...` (docstrings may still mention the alias)."""
    import ast

    offending = []
    for path in sorted((ROOT / "src" / "layerscope").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    docstrings.add(id(first.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if COMMAND.search(node.value):
                    offending.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:80]}")
    assert offending == []
