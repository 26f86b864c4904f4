"""What an analysis declares about itself: its name, inputs, options and (optionally) its figures.

``layerscope run NAME`` (its parsing, ``--help`` and one-line errors) is built from these declarations
(layerscope/cli/analysis_cmds.py); ``figures`` (report/figures.py) is what its reports draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """An analysis-specific option, e.g. ``--probe`` or ``--n 200``.

    The CLI builds ``layerscope run NAME`` from these declarations: its parsing, its ``--help``
    and its one-line errors (see layerscope/cli/analysis_cmds.py).
    """

    name: str  # python name; the flag is --name with _ as -
    type: type = str  # str, int, float, or bool (a flag)
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None  # the only values accepted, when they are a fixed few
    content: bool = False  # the value names a file or folder whose content is part of the run's identity

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def help_text(self) -> str:
        """The help line, with the accepted values when they are declared."""
        return self.help + (f" (one of: {', '.join(self.choices)})" if self.choices else "")


# What an analysis can read (AnalysisMetadata.inputs), as `layerscope run NAME --help` describes it.
INPUTS = {
    "pairs": "sentence pairs with a human score (STS Benchmark files, or CSV/TSV/JSONL with named columns)",
    "aligned": "paired texts: source, target and an optional category (CSV/TSV/JSONL with named columns)",
    "items": "compositionality items (JSONL: positive, negative, paraphrases)",
    "texts": "one text per row (.txt, .jsonl, .csv, .tsv or .parquet)",
    "labeled": "texts with a label (.jsonl, .csv or .tsv with text and label fields)",
    "text_pairs": "pairs of texts, no score needed (STS Benchmark files, JSONL with sentence1/sentence2, or "
                  "'text A<TAB>text B' lines)",
    "tagged": "words with a label each (CoNLL-U, or JSONL with a list of words and a list of labels per line)",
    "patch_pairs": "clean/corrupted text pairs of one token length each (JSONL: clean, corrupted; target and foil "
                   "for a decoder's logit difference, other for an encoder's similarity)",
    "steer_pairs": "positive/negative text pairs (JSONL: positive, negative)",
    "engine": "runs the model itself rather than reading cached vectors",
}


# What an analysis's ``compute`` reads from its engine (AnalysisMetadata.reads): what the engine of ``layerscope run``
# is opened for (early exit, extraction/engine_plan.py), so a run pays for the layers it asks and no more.
READS = {
    "vectors": "pooled vectors of the asked layers only (ctx.vectors, or the engine's pooled runs): the engine runs "
               "to the deepest asked layer and hands back the graph's pooled outputs alone where it has them",
    "layers": "the asked layers, token states too (token vectors, run_tokens): the engine runs to the deepest asked "
              "layer",
    "model": "more than the asked layers (the last layers, the model's own pooled output, a head on the last "
             "layer, gradients): the engine runs every block",
}


@dataclass(frozen=True)
class AnalysisMetadata:
    name: str
    description: str
    inputs: tuple[str, ...]  # what it reads (see INPUTS); shown in `layerscope run NAME --help`
    main_score: str  # the headline figure, a key in each model's "summary"
    default_poolings: tuple[str, ...] = ("mean",)
    default_data: str | None = None  # built-in data used when --data is not given
    needs_gradients: bool = False  # runs the model itself on the torch engine
    images: bool = False  # reads a vision tower's images: ``run`` takes --tower vision (a two-tower checkpoint's)
    options: tuple[Option, ...] = ()
    figures: Any = None  # what its reports show, declared once (report/figures.py); None: its own plots/report
    reads: str = "layers"  # what compute reads from its engine (see READS); decides how deep the engine runs

    def __post_init__(self) -> None:
        if self.reads not in READS:
            raise ValueError(f"analysis {self.name!r}: reads={self.reads!r}; one of {', '.join(READS)}")
