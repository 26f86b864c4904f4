"""``train-lens``: a tuned lens trained on a token store (decoding/tuned_train.py); ``run lens --tuned`` reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console, progress_printer
from layerscope.cli.root import app
from layerscope.decoding.tuned_record import TrainSettings

_D = TrainSettings()


@app.command("train-lens")
def train_lens(
    store: Path = typer.Argument(..., help="A token store of every layer (layerscope extract ... --tokens "
                                 "--layers all)."),
    out: Path = typer.Option(..., "--out", "-o", help="The lens folder to write (tuned-lens's layout: config.json, "
                             "params.pt; and lens.json, params.safetensors)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The store's model (default: the one it records)."),
    steps: int = typer.Option(_D.steps, "--steps", help="Optimiser steps."),
    tokens_per_step: int = typer.Option(_D.tokens_per_step, "--tokens-per-step", help="Stored tokens drawn per step."),
    lr_scale: float = typer.Option(_D.lr_scale, "--lr-scale", help="SGD's learning rate is this x (1 - momentum)."),
    momentum: float = typer.Option(_D.momentum, "--momentum", help="Nesterov momentum."),
    weight_decay: float = typer.Option(_D.weight_decay, "--weight-decay", help="Weight decay (towards the identity)."),
    warmup_steps: int = typer.Option(_D.warmup_steps, "--warmup-steps", help="Steps of linear warmup before the "
                                     "linear decay."),
    seed: int = typer.Option(_D.seed, "--seed", help="Seed of the order tokens are drawn in."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints "
                                                   "(default: every 5 minutes)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the checkpoint in --out."),
    force: bool = typer.Option(False, "--force", help="Replace a lens layerscope made in --out."),
):
    """Train a tuned lens (one affine translator per layer, Belrose et al. 2023) on a token store."""
    from rich.markup import escape

    from layerscope.decoding.tuned_train import train_lens as run

    c = console()
    settings = TrainSettings(steps=steps, tokens_per_step=tokens_per_step, lr_scale=lr_scale, momentum=momentum,
                             weight_decay=weight_decay, warmup_steps=warmup_steps, seed=seed)
    rec = run(store, out, model=model, settings=settings, resume=resume, force=force,
              checkpoint_every=checkpoint_every, say=progress_printer(c))
    speed = f", {rec.tokens_per_second:,.0f} tokens/s" if rec.tokens_per_second else ""
    c.print(f"[bold green]tuned lens[/bold green] {escape(str(out))}: {rec.num_layers} translators, "
            f"{rec.steps_done} steps, {rec.tokens_seen:,} tokens in {rec.seconds:.1f} s{speed}")
    first, last = rec.loss_first, rec.loss_last
    c.print(f"KL to the final layer (nats), first step -> last: layer 0 {first[0]:.4f} -> {last[0]:.4f}, "
            f"layer {rec.num_layers - 1} {first[-1]:.4f} -> {last[-1]:.4f}; decode with layerscope run lens "
            f"--tuned {escape(str(out))}")
