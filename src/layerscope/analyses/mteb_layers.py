"""``layerscope run mteb``: every layer x pooling evaluated as an embedding model by the ``mteb`` library.

Each (layer, pooling) becomes one MTEB encoder named
``layerscope/<model>__layer-<L>__<pooling>``; all of them share one vector cache,
so a text goes through the model once and comes back with every requested layer
and pooling.  MTEB itself runs the tasks and scores them; its result files
(``results/<model name>/<revision>/<Task>.json``, the format MTEB's leaderboard and
``mteb.load_results`` read) are kept in ``results.json`` and written under
``mteb/`` of the result directory.

No task data is downloaded when it is at hand locally: STSBenchmark reads the STS
Benchmark test file (``../shared/data/stsbenchmark/sts-test.csv`` or
``$LAYERSCOPE_STS_DIR``), and ``--data`` gives any single STS-type task its pairs
(a pairs file or a dataset, as for ``layerscope run sts``).  Other tasks load through
MTEB from the hub as usual.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.analyses.common import layers_for, poolings_for
from layerscope.errors import InputError, MissingExtraError
from layerscope.report.figures import Curve, Figures, Line, Table
from layerscope.progress import track

LOCAL_STS = {"STSBenchmark": "test"}  # MTEB task -> STS Benchmark split we hold locally


def _mteb():
    try:
        import mteb
    except ImportError:
        raise MissingExtraError("mteb", "mteb") from None
    return mteb


class VectorCache:
    """Every requested layer x pooling of each (prompt, text), computed once."""

    def __init__(self, model, layers: list[str], poolings: list[str]):
        self.model = model  # a layerscope.session.EmbeddingModel
        self.layers, self.poolings = layers, poolings
        self.rows: dict[tuple[str | None, str], int] = {}
        self.blocks: list[dict[tuple[str, str], np.ndarray]] = []
        self.offsets: list[int] = []
        self.texts_run = 0

    def get(self, texts: list[str], pooling: str, layer: str, prompt_name: str | None) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if (prompt_name, t) not in self.rows))
        if todo:
            start = len(self.rows)
            block = self.model.embed(todo, layers=self.layers, poolings=self.poolings, prompt_name=prompt_name)
            self.blocks.append(block)
            self.offsets.append(start)
            for i, t in enumerate(todo):
                self.rows[prompt_name, t] = start + i
            self.texts_run += len(todo)
        out = np.empty((len(texts), self.model.hidden_size), np.float32)
        for i, t in enumerate(texts):
            row = self.rows[prompt_name, t]
            b = int(np.searchsorted(self.offsets, row, side="right")) - 1
            out[i] = self.blocks[b][pooling, layer][row - self.offsets[b]]
        return out


def _encoder(cache: VectorCache, name: str, revision: str, layer: str, pooling: str, similarity: str):
    """One MTEB encoder: the vectors of one layer and pooling."""
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class LayerEncoder(AbsEncoder):
        def __init__(self):
            self.mteb_model_meta = ModelMeta.create_empty({
                "name": name, "revision": revision, "similarity_fn_name": ScoringFunction(similarity),
                "embed_dim": cache.model.hidden_size, "framework": ["PyTorch"]})

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            texts = [t for batch in inputs for t in batch["text"]]
            prompts = cache.model.prompts
            wanted = getattr(prompt_type, "value", prompt_type)
            prompt_name = next((p for p in (task_metadata.name, wanted) if p and p in prompts), None)
            return cache.get(texts, pooling, layer, prompt_name)

    return LayerEncoder()


def _pairs_dataset(pairs):
    from datasets import Dataset

    return Dataset.from_dict({"sentence1": list(pairs.s1), "sentence2": list(pairs.s2),
                              "score": [float(s) for s in pairs.scores]})


@register
class MtebAnalysis(Analysis):
    metadata = AnalysisMetadata(
        name="mteb",
        reads="vectors",
        description="every layer x pooling as an embedding model, scored by the mteb library (MTEB-format results)",
        inputs=("pairs", "engine"),
        main_score="best_main_score",
        default_poolings=("mean",),
        default_data="STSBenchmark: ../shared/data/stsbenchmark/sts-test.csv (local)",
        options=(Option("tasks", str, "STSBenchmark", "comma list of MTEB task names"),
                 Option("batch", int, 64, "texts per encode call MTEB hands over"),),
        figures=Figures(
            preface="MTEB-format results per layer and pooling are under mteb/results/.",
            sentence="best {best.task} main score {best.main_score:.4f} at layer {best.layer} ({best.pooling}); "
                     "{texts_run} texts run once for all layers",
            summary_numbers=("best_main_score", "texts_run"), curves=(
                Curve("layers", (Line("main_score", "MTEB main score"),), file="mteb_layers",
                      title="MTEB main score by layer", ylabel="MTEB main score", per_model=False,
                      group=("task", "pooling"),
                      caption="Every layer × pooling scored as an embedding model by the mteb library; MTEB's own "
                              "result files are under mteb/results/."),),
            tables=(Table("layers", ("task", "pooling", "layer", "main_score"), digits=4, numbers=("main_score",)),)),
    )

    def prepare(self, ctx: Context) -> dict[str, Any]:
        mteb = _mteb()
        _datasets_or_hint()
        names = [t.strip() for t in str(self.options(ctx).tasks or "").split(",") if t.strip()]
        if not names:
            raise InputError("--tasks is empty; name MTEB tasks such as STSBenchmark")
        if ctx.spec.data and len(names) != 1:
            raise InputError("--data gives the pairs of one STS task; run one task per --data")
        tasks, local_pairs = {}, {}
        for name in names:
            try:
                task = mteb.get_task(name)
            except Exception as exc:  # mteb raises KeyError/ValueError with its own suggestions
                raise InputError(f"MTEB has no task '{name}' ({str(exc).splitlines()[0][:160]})") from None
            local = self._local_pairs(ctx, name, task)
            if local is not None:
                from datasets import DatasetDict

                split = task.metadata.eval_splits[0]
                task.dataset = DatasetDict({split: _pairs_dataset(local)})
                task.data_loaded = True  # MTEB skips its own (hub) loading
                ctx.say(f"{name}: {len(local)} pairs from {local.source} (local, split {split})")
                local_pairs[name] = local  # kept for model-vs-model tests on the same pairs
            tasks[name] = task
        return {"tasks": tasks, "pairs": local_pairs}

    @staticmethod
    def _local_pairs(ctx: Context, name: str, task):
        from layerscope.data.pairs import default_sts_file, read_pairs

        if ctx.spec.data:
            if task.metadata.type != "STS":
                raise InputError(f"--data gives pairs for STS tasks; {name} is a {task.metadata.type} task")
            return read_pairs(ctx.spec.data)
        if name in LOCAL_STS:
            path = default_sts_file(LOCAL_STS[name])
            if Path(path).exists():
                return read_pairs(path)
        return None

    def compute(self, ctx: Context, run: ModelRun, data: dict[str, Any]) -> ModelOutput:
        import logging
        import warnings

        mteb = _mteb()
        from layerscope.session import EmbeddingModel

        layers = layers_for(ctx, run)
        poolings = poolings_for(ctx, run)
        cache = VectorCache(EmbeddingModel.from_engine(run.engine), layers, poolings)
        slug = run.name.replace("/", "-")
        from layerscope.ownership import safe_part

        revision = safe_part(str(run.handle.manifest.source.weights_sha256 or "local")[:12],
                             "the model's source.weights_sha256")
        st = run.handle.manifest.sentence_transformers or {}
        rows, files = [], {}
        with tempfile.TemporaryDirectory(prefix="layerscope-mteb-") as tmp:
            result_cache = mteb.ResultCache(tmp)

            def score(task_name, task, pooling, layer):
                similarity = (st.get("similarity_fn_name") or "cosine") if pooling == "st" else "cosine"
                name = f"layerscope/{slug}__layer-{layer}__{pooling}"
                enc = _encoder(cache, name, revision, layer, pooling, _scoring(similarity))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    level = logging.getLogger("mteb").level
                    logging.getLogger("mteb").setLevel(logging.ERROR)
                    try:
                        res = mteb.evaluate(enc, task, cache=result_cache, overwrite_strategy="always",
                                            show_progress_bar=False, raise_error=True,
                                            encode_kwargs={"batch_size": self.options(ctx).batch})
                    except Exception as exc:  # dataset download refused offline, and the like
                        raise InputError(f"MTEB could not run {task_name}: "
                                         f"{str(exc).splitlines()[0][:200]}; give its data with --data "
                                         "(STS tasks) or run where the hub is reachable") from None
                    finally:
                        logging.getLogger("mteb").setLevel(level)
                for tr in res.task_results:
                    for split, scores in tr.scores.items():
                        for s in scores:
                            rows.append({"task": task_name, "split": split, "subset": s.get("hf_subset"),
                                         "pooling": pooling, "layer": layer, "main_score": s["main_score"],
                                         **{k: s[k] for k in ("cosine_spearman", "cosine_pearson") if k in s}})

            for task_name, task in data["tasks"].items():
                plan = [(pooling, layer) for pooling in poolings for layer in layers]
                # the first score runs the model over the task's texts for every layer and pooling at once;
                # the rest only read the cache: timed apart, so the time left is not the first one's times L
                ctx.say(f"MTEB {task_name}: running the model over its texts once (every layer and pooling)")
                score(task_name, task, *plan[0])
                for pooling, layer in track(plan[1:], f"MTEB {task_name}: scoring the other layers x poolings"):
                    score(task_name, task, pooling, layer)
            for path in sorted(Path(tmp).rglob("*.json")):
                files[str(path.relative_to(tmp))] = json.loads(path.read_text(encoding="utf-8"))
        for r in rows:  # MTEB gives NaN where every text got the same vector (an undefined correlation)
            if r["main_score"] is None or not np.isfinite(r["main_score"]):
                r["main_score"] = None
        compare = _sts_rows(run, cache, rows, data.get("pairs") or {})
        defined = [r for r in rows if r["main_score"] is not None]
        best = max(defined, key=lambda r: r["main_score"]) if defined else None
        final = str(run.num_layers)
        summary = {"tasks": list(data["tasks"]), "texts_run": cache.texts_run,
                   "best_main_score": best["main_score"] if best else None,
                   "best": {k: best[k] for k in ("task", "pooling", "layer", "main_score")} if best else None,
                   "final_layer": {f"{r['task']}/{r['pooling']}": r["main_score"] for r in rows if r["layer"] == final}}
        return ModelOutput({"summary": summary, "tables": {"layers": rows}, "mteb_files": files}, compare=compare)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models

        return compare_models(per_model, score="main_score", score_label="MTEB main score",
                              group_label="task_pooling", seed=ctx.spec.seed, say=ctx.say)

    # ------------------------------------------------------------ rendering (saved results only)
    def plots(self, results, out_dir: Path) -> list[str]:
        """MTEB's own result files, re-written from typed results (everything else it shows is declared in
        ``figures``); the typed loader refused any path that would leave the result folder, and this checks again."""
        made = super().plots(results, out_dir)
        root = (out_dir / "mteb").resolve()
        for figures in results.per_model.values():
            for rel, content in figures.mteb_files.items():
                target = (root / rel).resolve()
                if root not in target.parents:
                    continue  # a path that would leave the result directory is not written
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        return made


def _scoring(name: str) -> str:
    return {"cosine": "cosine", "dot": "dot", "dot_product": "dot", "euclidean": "euclidean",
            "manhattan": "manhattan"}.get(name, "cosine")


def _datasets_or_hint() -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise MissingExtraError("datasets", "mteb") from None


def _sts_rows(run: ModelRun, cache: VectorCache, rows: list[dict], pairs: dict):
    """Rows for model vs model: on an STS task whose pairs we hold, the main score (Spearman of cosines) as a
    function of the pairs, from the same cached vectors MTEB scored; it must reproduce MTEB's own figure."""
    from layerscope.analyses.compare import ScoreRow, model_rows
    from layerscope.metrics.vectors import paired_cosine
    from layerscope.metrics.paired import correlation_scorer

    kept, notes, n_items = [], [], set()
    for r in rows:
        scorer, p = None, pairs.get(r["task"])
        if p is not None and r["main_score"] is not None and r["pooling"] != "st":
            prompt = r["task"] if r["task"] in cache.model.prompts else None
            sims = paired_cosine(cache.get(list(p.s1), r["pooling"], r["layer"], prompt),
                                 cache.get(list(p.s2), r["pooling"], r["layer"], prompt))
            scorer = correlation_scorer(sims, p.scores)
            if abs(float(scorer(np.arange(len(sims)))) - r["main_score"]) > 1e-5:
                scorer = None
                notes.append(f"{r['task']}: our cosines do not reproduce MTEB's score, so it is not resampled")
            n_items.add(len(sims))
        kept.append(ScoreRow(f"{r['task']} {r['pooling']}", str(r["layer"]), r["main_score"], None, scorer,
                             bootstrap_ci=scorer is not None))
    if len(n_items) > 1:  # several STS tasks: items differ per task, so no resampling across them
        kept = [ScoreRow(k.group, k.layer, k.value) for k in kept]
        notes.append("several local STS tasks: scores are shown side by side without resampled tests")
    return model_rows(run.num_layers, n_items.pop() if len(n_items) == 1 else 0, kept, notes)
