"""The root ``layerscope`` app, its sub-apps (``index``, ``cache``) and the global options."""

from __future__ import annotations

import logging
import os

import typer

from layerscope.cli.common import STATE


def _flags_show_no_type() -> None:
    """typer 0.29 prints a type (``<bool>``) beside every flag in --help, though a flag takes no value; show
    none for flags (every other option keeps its ``<int>``, ``<path>``, ...)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "layerscope_flags", False):  # other typer versions: nothing to mend
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich.layerscope_flags = True
    TyperOption.display_type_rich = display_type_rich


_flags_show_no_type()

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="layerscope: look inside embedding models layer by layer, fast. "
                       "(`inspect` is the same command, kept as an alias; it collides with inspect-ai's CLI.)")
index_app = typer.Typer(no_args_is_help=True, help="FAISS indexes over a layer store.")
app.add_typer(index_app, name="index")
cache_app = typer.Typer(no_args_is_help=True, help="What layerscope keeps in its cache ($LAYERSCOPE_HOME or ~/.cache/layerscope).")
app.add_typer(cache_app, name="cache")


def _show_version(value: bool) -> None:
    if value:
        import layerscope

        print(f"layerscope {layerscope.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print layerscope's version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="Only print results and errors."),
          verbose: bool = typer.Option(False, "--verbose", "-v", help="Say more, e.g. why --engine auto passed "
                                       "over each engine.")):
    STATE["debug"] = debug
    STATE["verbose"] = verbose or debug
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(message)s")
    for noisy in ("transformers", "optimum", "torch", "urllib3", "huggingface_hub", "matplotlib", "faiss"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # no retry warnings before our one error line
        import warnings

        warnings.filterwarnings("ignore")
