"""What every command module shares: the consoles, list splitting, the --dataset plumbing."""

from __future__ import annotations

import sys

STATE = {"debug": False, "verbose": False}


def console():
    import shutil

    from rich.console import Console

    # Wide enough for the per-layer tables when the output goes to a pipe or a log file; there a line of text is
    # never broken (a path or a command to copy stays whole), as on a terminal, which wraps it by itself.
    tty = sys.stdout.isatty()
    width = None if tty else max(120, shutil.get_terminal_size((120, 24)).columns)
    return Console(stderr=False, highlight=False, width=width, soft_wrap=not tty)


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def progress_printer(c):
    """A progress callback that prints each step dim on console ``c``."""
    from rich.markup import escape

    return lambda msg: c.print(f"[dim]- {escape(str(msg))}[/dim]")


def split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def data_source(path: str | None, dataset: str | None, config: str | None, split: str | None,
                flag: str, required: bool = True) -> str | None:
    """A file path, or the one-string form of --dataset/--config/--split."""
    from layerscope.errors import InputError

    if dataset is None:
        if config or split:
            raise InputError("--config and --split go with --dataset")
        if path is None and required:
            raise InputError(f"give {flag} FILE or --dataset NAME")
        return path
    if path is not None:
        raise InputError(f"give {flag} or --dataset, not both")
    from layerscope.data.hf_dataset import dataset_spec

    return dataset_spec(dataset, config, split)


def engine_options(**options) -> dict | None:
    kept = {k: v for k, v in options.items() if v is not None}  # an explicit --threads 0 is refused, not dropped
    return kept or None


def click_exceptions():
    """The click exceptions module typer uses: its own copy from typer 0.29, the click package before."""
    try:
        from typer._click import exceptions
    except ImportError:  # typer < 0.29
        from click import exceptions
    return exceptions
