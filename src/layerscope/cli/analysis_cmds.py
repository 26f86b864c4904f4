"""``run NAME``, ``report`` and ``analyses``: one ``run`` subcommand per analysis, built from its metadata.

``run`` is a command group whose subcommands are made on demand from the analyses the registry
finds: the options every analysis shares (``--model``, ``--layers``, ...) plus the analysis's own
declared ``Option``s, each with its type, default, help and choices. So ``layerscope run sts --help``
lists ``--probe``, click parses every option, and a mistyped one is one line naming the valid ones.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from layerscope.cli.common import click_exceptions, console, data_source, split_list
from layerscope.cli.root import app
from layerscope.engines.registry import names_text


def _shared_options(meta=None) -> list[tuple[str, Any, Any]]:
    """``(name, annotation, typer.Option)`` of the options every analysis takes; help from ``meta`` if given."""
    data_help = "Data file (default: the analysis's own)."
    pooling_help = "Comma list of poolings (default: the analysis's)."
    engine_help = f"{names_text()}."
    if meta is not None:
        from layerscope.analyses.base import INPUTS

        reads = "; ".join(INPUTS[k] for k in meta.inputs if k != "engine") or "data"
        data_help = f"Data file: {reads} (default: {meta.default_data or 'none'})."
        pooling_help = f"Comma list of poolings (default: {','.join(meta.default_poolings)})."
        if meta.needs_gradients:
            engine_help = "torch or auto (this analysis needs gradients: it runs on torch)."
    return [
        ("model", list[str], typer.Option(["minilm"], "--model", "-m", help="Model(s); repeat for side by side.")),
        ("label", Optional[list[str]], typer.Option(None, "--label", help="A short name per --model (repeat, in "
                                                    "the same order) for tables, legends and reports (default: "
                                                    "the folder's last part, the alias or the hub id).")),
        ("engine", str, typer.Option("auto", "--engine", "-e", help=engine_help)),
        ("layers", str, typer.Option("all", help="all, or e.g. raw,0,3,-1.")),
        ("pooling", Optional[str], typer.Option(None, help=pooling_help)),
        ("data", Optional[str], typer.Option(None, "--data", "-d", help=data_help)),
        ("dataset", Optional[str], typer.Option(None, "--dataset", help="Hugging Face dataset instead of --data: "
                                                "a hub name, a save_to_disk directory or .arrow file(s).")),
        ("config", Optional[str], typer.Option(None, "--config", help="Dataset configuration (with --dataset).")),
        ("split", Optional[str], typer.Option(None, "--split", help="Dataset split (with --dataset).")),
        ("out", Optional[Path], typer.Option(None, "--out", "-o", help="Result directory (default "
                                             "results/<model>/<revision>/<analysis>/<run spec hash>).")),
        ("seed", int, typer.Option(0, help="Seed for every random choice.")),
        ("no_cache", bool, typer.Option(False, "--no-cache", help="Do not reuse or write cached vectors.")),
        ("trust_remote_code", bool, typer.Option(False, "--trust-remote-code",
                                                 help="Allow code from the model repo to run (off by default).")),
        ("recompute", bool, typer.Option(False, "--recompute", help="Run again even if this result is already there.")),
        ("force", bool, typer.Option(False, "--force", help="Replace a result dir that holds a different run.")),
        ("max_length", Optional[int], typer.Option(None, "--max-length", min=1, help="Tokens per text (default: the "
                                                   "model's; longer texts are truncated).")),
        ("batch_tokens", Optional[int], typer.Option(None, "--batch-tokens", min=1,
                                                     help="Padded tokens per batch (default: the engine's).")),
    ]


SHARED = tuple(name for name, _, _ in _shared_options())


def _with_signature(func, params: list[tuple[str, Any, Any]], *, context: bool = False):
    """Give ``func(**values)`` the signature typer reads its options from."""
    first = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)] if context else []
    func.__signature__ = inspect.Signature(first + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
        for name, annotation, info in params])
    return func


def _check_choice(option):
    def check(value):
        if value is not None and str(value) not in option.choices:
            from layerscope.errors import unknown_name

            raise unknown_name(option.flag, str(value), option.choices)
        return value

    return check


def _own_option(option, panel: str) -> tuple[str, Any, Any]:
    """An analysis's declared Option as a typer option in the help panel of the analysis's own options."""
    if option.name in SHARED:
        raise ValueError(f"analysis option {option.flag} clashes with the option every analysis has")
    annotation = option.type if option.default is not None or option.type is bool else Optional[option.type]
    return option.name, annotation, typer.Option(option.default, option.flag, help=option.help_text,
                                                 rich_help_panel=panel,
                                                 callback=_check_choice(option) if option.choices else None)


class AnalysisCommand(TyperCommand):
    """``run NAME``: an unknown option is one line naming the analysis's own options, with the closest one."""

    def parse_args(self, ctx, args):
        from layerscope.errors import InputError, did_you_mean

        exceptions = click_exceptions()
        try:
            return super().parse_args(ctx, args)
        except exceptions.NoSuchOption as exc:
            flags = [f for p in self.params for f in getattr(p, "opts", ()) if f.startswith("--")]
            own = ", ".join(getattr(self, "own_flags", [])) or "none"
            raise InputError(f"analysis '{self.name}' has no option {exc.option_name}"
                             f"{did_you_mean(exc.option_name, flags, key=lambda f: f.lstrip('-'))}; its own options: {own} "
                             f"(every option: layerscope run {self.name} --help)") from None
        except exceptions.UsageError as exc:  # a bad value, a missing value: one line too
            raise InputError(f"run {self.name}: {exc.format_message()}") from None


def analysis_command(cls) -> TyperCommand:
    """The ``run NAME`` command of one analysis class, built from its metadata."""
    meta = cls.metadata
    params = _shared_options(meta) + [_own_option(o, f"Options of {meta.name}") for o in meta.options]
    if meta.images:
        params.append(("tower", Optional[str], typer.Option(None, "--tower", help="'vision': the image tower of a "
                                                            "two-tower checkpoint (CLIP, SigLIP).")))

    def run_it(**values):
        shared = {name: values.pop(name) for name in SHARED}
        tower = values.pop("tower", None)  # the image analyses' own shared option; the rest are the analysis's
        run_from_cli(meta.name, options=values, tower=tower, **shared)

    one = typer.Typer(add_completion=False)
    ends = "" if meta.description.endswith(("?", ".")) else "."
    doc = f"{meta.description}{ends}\n\nMain score: {meta.main_score}."
    one.command(meta.name, cls=AnalysisCommand, help=doc, rich_help_panel="Analyses")(_with_signature(run_it, params))
    command = typer.main.get_command(one)
    command.own_flags = [o.flag for o in meta.options]
    return command


class AnalysisGroup(TyperGroup):
    """The analyses as ``run``'s subcommands, listed from the registry and built on demand."""

    def __init__(self, **attrs):
        attrs.setdefault("subcommand_metavar", "ANALYSIS [OPTIONS]...")
        super().__init__(**attrs)

    def list_commands(self, ctx):
        from layerscope.analyses.base import registry

        return sorted(registry())

    def get_command(self, ctx, name):
        from layerscope.analyses.base import get_analysis

        return analysis_command(get_analysis(name))  # an unknown name: one line with the closest one


def run(ctx: typer.Context, **shared):
    """Run an analysis over one or more models; write results.json, tables, plots and report.md.

    Each analysis has its own options: `layerscope run sts --help` lists them (`layerscope analyses` too).
    """
    # options given before the analysis name are that analysis's defaults
    ctx.default_map = {ctx.invoked_subcommand: shared}


app.command("run", cls=AnalysisGroup, no_args_is_help=True)(_with_signature(run, _shared_options(), context=True))


def run_from_cli(name: str, *, model, label, engine, layers, pooling, data, dataset, config, split, out, seed, no_cache,
                 trust_remote_code, recompute, force, max_length, batch_tokens, options: dict[str, Any],
                 tower: str | None = None) -> None:
    from layerscope.analyses.base import RunRequest, get_analysis, run_analysis

    cls = get_analysis(name)
    data = data_source(data, dataset, config, split, "--data", required=False)
    c = console()
    request = RunRequest(models=model, labels=label or None, engine=engine, layers=layers,
                         poolings=split_list(pooling), data=data, out=out, seed=seed, options=options,
                         cache=not no_cache, console=c, recompute=recompute, force=force,
                         trust_remote_code=trust_remote_code, max_length=max_length, batch_tokens=batch_tokens,
                         tower=tower)
    outcome = run_analysis(name, request)
    result_dir = outcome.out
    from layerscope.analyses.rendering import print_summary
    from layerscope.report.compare import print_comparison

    print_summary(cls(), outcome.saved, c)
    print_comparison(outcome.saved, c)
    from rich.markup import escape

    if outcome.reused:
        c.print(f"[bold green]reused[/bold green] {escape(str(result_dir))}/ (same models, data and options; "
                "--recompute runs it again)")
    else:
        c.print(f"[bold green]wrote[/bold green] {escape(str(result_dir))}/ (results.json, report.md, tables, plots)")


@app.command()
def report(result_dir: Path = typer.Argument(..., help="A directory written by layerscope run.")):
    """Re-render the plots, tables, report.md and report.html of a result directory from results.json alone."""
    from layerscope.analyses.base import rerender

    from rich.markup import escape

    done = rerender(result_dir)
    made = " and ".join(done.files())
    console().print(f"[bold green]re-rendered[/bold green] {escape(str(result_dir))}: {escape(made)}, "
                    f"{len(done.plots)} plot(s), {len(done.tables)} table(s)", soft_wrap=True)
    if done.page is None:
        console().print("report.html was not rewritten: it needs plotly (pip install plotly)")


@app.command()
def analyses(name: Optional[str] = typer.Argument(None, help="Show one analysis's options in full.")):
    """List the analyses (or one analysis's options)."""
    from rich.table import Table

    from layerscope.analyses.base import get_analysis, registry

    if name:
        meta = get_analysis(name).metadata
        table = Table(title=f"layerscope run {name}: {meta.description}")
        for col in ("option", "type", "default", "what it does"):
            table.add_column(col)
        for o in meta.options:
            table.add_row(o.flag, o.type.__name__, str(o.default), o.help_text)
        console().print(table)
        console().print(f"main score: {meta.main_score}; default poolings: {', '.join(meta.default_poolings)}")
        return
    table = Table(title="analyses: layerscope run NAME ... (layerscope analyses NAME for its options)")
    table.add_column("name")
    table.add_column("what it does")
    table.add_column("its own options")
    for key, cls in sorted(registry().items()):
        meta = cls.metadata
        table.add_row(key, meta.description, " ".join(o.flag for o in meta.options) or "-")
    console().print(table)
