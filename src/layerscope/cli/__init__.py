"""The ``layerscope`` (alias ``inspect``) command: parse, call the library, print.

One module per command group (export, store, analysis, index, bench, cache commands); this is
the only place that turns errors into exit codes: a LayerscopeError becomes one red line and
exit code 2; a traceback is shown only under --debug.
"""

from __future__ import annotations

import sys

import typer

from layerscope.cli.common import STATE, click_exceptions, err_console
from layerscope.cli.root import app

# Each module registers its commands on ``app``; the order here is the order of ``--help``.
from layerscope.cli import export_cmds, store_cmds, analysis_cmds, index_cmds, bench_cmds, cache_cmds  # noqa: E402,F401,I001
from layerscope.cli import image_cmds, lens_cmds  # noqa: E402,F401

__all__ = ["app", "main"]


_SIGNALLED: list[int] = []  # the signal that stopped this run, when it was SIGTERM


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (what schedulers send before SIGKILL) stops a run the way Ctrl-C does: the work done is kept
    and the same resume hint is printed; the exit code is then 143 (128 + SIGTERM)."""
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt


def _interrupt_code(code: int = 130) -> int:
    return 128 + _SIGNALLED[-1] if _SIGNALLED else code


def main(argv: list[str] | None = None) -> None:
    from layerscope.signals import sigterm_stops

    _SIGNALLED.clear()
    with sigterm_stops(_on_sigterm):  # this process only: a child never runs it (layerscope/signals.py)
        return _main(argv)


def _main(argv: list[str] | None) -> None:
    from rich.markup import escape

    from layerscope.errors import Interrupted, LayerscopeError

    try:
        # With standalone_mode=False typer turns Ctrl-C into Exit(130) and *returns* that code instead of
        # exiting, so the code must be passed on here (dropping it made Ctrl-C exit 0).
        code = app(args=argv, standalone_mode=False, prog_name="layerscope")
    except Interrupted as exc:  # the library's own Ctrl-C message: how much was kept, how to continue
        err_console().print(f"[yellow]{escape(str(exc))}[/yellow]", soft_wrap=True)
        sys.exit(_interrupt_code(exc.exit_code))
    except LayerscopeError as exc:
        if STATE["debug"]:
            raise
        # escaped: "pip install 'layerscope[ray]'" must not lose "[ray]" to rich's markup
        err_console().print(f"[bold red]error:[/bold red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # outside typer's own handling (e.g. while it starts)
        err_console().print("[yellow]interrupted[/yellow]")
        sys.exit(_interrupt_code())
    except Exception as exc:  # usage errors and the unexpected
        # typer >= 0.29 carries its own click; older typer uses the click package
        exit_cls, abort_cls = getattr(typer, "Exit", None), getattr(typer, "Abort", None)
        ClickException = click_exceptions().ClickException  # noqa: N806

        if exit_cls is not None and isinstance(exc, exit_cls):
            sys.exit(getattr(exc, "exit_code", 0))
        if isinstance(exc, ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if abort_cls is not None and isinstance(exc, abort_cls):
            sys.exit(_interrupt_code())
        if STATE["debug"]:
            raise
        err_console().print(f"[bold red]internal error:[/bold red] {type(exc).__name__}: {escape(str(exc))} "
                            "(re-run with --debug for the traceback, and please report it)", soft_wrap=True)
        sys.exit(1)
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        if code == 130:
            err_console().print("[yellow]interrupted[/yellow]")
            code = _interrupt_code()
        sys.exit(code)
