"""Every shell example and Python line of README.md and docs/USAGE.md runs as written.

The examples are read from the documents themselves (fenced ``bash`` and ``python`` blocks, and inline
``layerscope ... --option`` commands and Python calls), so a new example is run by default; the ones that
need a hub model or run for long are listed in ``SKIPPED`` with the reason.  They run in document order, in
one temporary folder and a fresh ``LAYERSCOPE_HOME``, with ``../shared/data/stsbenchmark/`` beside it as in
a checkout, holding every ``STS_STRIDE``-th pair of the real files so that the run stays short.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hang_guard import HANG_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/USAGE.md")
HUB = "needs a model from the Hugging Face hub"
SKIPPED = {
    "bash scripts/quickstart.sh": "installs packages and exports the model; tests/test_readme.py checks what it calls",
    "bash scripts/test.sh": "runs the whole test suite",
    "layerscope run token_alignment --model qwen2.5-0.5b --generate zh-en --n 200": HUB,
    "layerscope run lens --model Qwen/Qwen2.5-0.5B": HUB,
    # tests/decoding/test_tuned_train.py and tests/analyses/test_lens_tuned.py run these three on tiny models
    "layerscope extract --model Qwen/Qwen2.5-0.5B --input corpus.txt --out tokens/ --tokens": HUB,
    "layerscope train-lens tokens/ --out lens/": HUB + " (its token store)",
    "layerscope run lens --model Qwen/Qwen2.5-0.5B --tuned lens/ --data held-out.txt": HUB,
    # tests/test_readme_image_example.py runs these two on a tiny random CLIP in its place
    "layerscope export openai/clip-vit-base-patch32 --tower vision --out clip-vision/": HUB,
    "layerscope run vision_lens --model clip-vision/ --n 500": HUB,
    "layerscope extract-images clip-vision/ photos/ --out stores/photos --tokens": HUB + " (a vision tower)",
    "layerscope extract-images clip-vision/ photos/ --out stores/photos --tokens --resume": HUB + " (a vision tower)",
    "layerscope run sts --model minilm --model bert-base-uncased": HUB,
    "layerscope run similarity --model minilm --tokens --max-tokens 2000 --indices all":
        "runs for minutes (an SVD per permutation and layer pair); tests/analyses/test_similarity_indices.py runs "
        "the indices on a tiny model",
    "layerscope run token_probe --model minilm --data en_ewt-ud-dev.conllu":
        "needs a Universal Dependencies treebank; tests/analyses/test_token_probe_run.py runs a CoNLL-U file it writes",
    "layerscope run sae --sae gpt2-small-res-jb/blocks.7.hook_resid_pre --store gpt2-store/":
        "needs an SAE trained with SAELens and a GPT-2 token store; tests/analyses/test_sae_run.py runs SAEs it "
        "saves with SAELens",
    "layerscope run word_context --model bert-base-uncased --data texts.txt --words bank,spring --last-k 4": HUB,
    "layerscope run sts --model minilm --data ../shared/data/stsbenchmark/sts-test.csv --probe":
        "trains an MLP and per-layer siamese encoders on sts-train: minutes",
    "layerscope --quiet": "the global option named in a sentence, not a command",
}
# the small inputs the examples name (corpus.txt, corpus.jsonl); "is" is the token id 2003 the docs look up
CORPUS = ["A man is playing a guitar.", "The food was great.", "A dog is running in the park.",
          "Stocks fell sharply on Monday.", "The cat is asleep on the sofa."]
STS_STRIDE = 12  # the STS files the examples read: every 12th pair (115 of sts-test's 1,379), all sources
PLACEHOLDER = re.compile(r"\.\.\.|\[|\b[A-Z][A-Z_]{2,}\b")  # `...`, [optional] parts, STORE, NAME, PATH


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    kind: str  # "shell" or "python"
    code: str


def _shell_lines(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def _is_python_call(span: str) -> bool:
    if not re.match(r"^[A-Za-z_][\w.]*\(", span):
        return False
    try:
        tree = ast.parse(span)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.Call) for node in ast.walk(tree))


def examples(doc: str) -> list[Example]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    found: list[Example] = []
    fences = list(re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M))
    for m in fences:
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) == "bash":
            found += [Example(doc, line, "shell", cmd) for cmd in _shell_lines(m.group(2))]
        elif m.group(1) == "python":
            found.append(Example(doc, line, "python", m.group(2)))
    prose = re.sub(r"^```\w*\n.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for m in re.finditer(r"`([^`\n]+)`", prose):
        span, line = m.group(1).strip(), prose.count("\n", 0, m.start()) + 1
        if span.startswith("layerscope ") and " --" in span:
            if span in SKIPPED or not PLACEHOLDER.search(span.removeprefix("layerscope ")):
                found += [Example(doc, line, "shell", cmd) for cmd in span.split("; ")]
        elif span in SKIPPED or (_is_python_call(span.split("; ")[-1]) and re.search(r"layerscope|LayerStore", span)):
            # layerscope's own API; a library call named in prose (scipy.stats.bootstrap(...)) is not an example
            found.append(Example(doc, line, "python", span.replace("; ", "\n")))
    return sorted(found, key=lambda e: e.line)


def _all_examples() -> list[Example]:
    return [e for doc in DOCS for e in examples(doc)]


def test_the_examples_are_found_and_every_skip_names_one_that_is_there():
    """Catches: an extractor that finds nothing (so nothing runs), and a skip list that outlives its example."""
    found = _all_examples()
    codes = {e.code for e in found}
    assert set(SKIPPED) <= codes, set(SKIPPED) - codes
    readme = [e.code for e in found if e.doc == "README.md"]
    assert "layerscope extract --model minilm --input corpus.txt --out store/" in readme
    assert 'from layerscope import LayerStore\nLayerStore.open("store")["st", -1]' in readme
    assert sum(c.startswith("layerscope run ") for c in readme) == 18
    usage = [e for e in found if e.doc == "docs/USAGE.md"]
    assert [e.kind for e in usage].count("python") == 3  # a library call named in prose is not among them
    assert "layerscope extract --model exports/minilm --engine ort --input corpus.txt --out stores/corpus " \
           "--layers all --pooling mean,cls" in {e.code for e in usage}


def _filled(code: str, cwd: Path) -> str | None:
    """``code`` with each ``<rev>``/``<run>`` path (a folder a run wrote) replaced by the one that is there."""
    for m in re.finditer(r"'?([^\s']*<\w+>[^\s']*)'?", code):
        matches = sorted(glob.glob(re.sub(r"<\w+>", "*", m.group(1)), root_dir=cwd))
        if not matches:
            return None
        code = code.replace(m.group(0), shlex.quote(matches[0]))
    return code


def _run(example: Example, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    if example.kind == "python":
        argv = [sys.executable, "-c", example.code]
    else:
        code = _filled(example.code, cwd)
        if code is None:
            return 1, "no folder matches its <placeholder> path"
        argv = ["bash", "-c", 'layerscope() { "$LAYERSCOPE_PY" -m layerscope "$@"; }\n' + code]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)
    return proc.returncode, (proc.stderr.strip() or proc.stdout.strip())[-600:]


def _small_sts(real: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        lines = (real / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (dest / name).write_text("".join(lines[::STS_STRIDE]), encoding="utf-8")


@pytest.mark.slow
@pytest.mark.long
def test_every_example_of_the_readme_and_usage_runs_as_written(tmp_path, sts_dir, minilm_export):
    """Catches: a documented command or Python line that errors on a fresh machine (a pooling the store does
    not hold, an import path that is not public, an option that was renamed). The fresh home starts with
    MiniLM's export already in its cache (copied with its files' times, so its record of them holds): the
    export itself is proven elsewhere; what runs here is every documented command and line as written."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copytree(minilm_export, tmp_path / "home" / "exports" / minilm_export.name, symlinks=True)
    _small_sts(sts_dir, tmp_path / "shared" / "data" / "stsbenchmark")
    (work / "corpus.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    (work / "corpus.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in CORPUS), encoding="utf-8")
    env = dict(os.environ, LAYERSCOPE_HOME=str(tmp_path / "home"), LAYERSCOPE_PY=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    env.pop("LAYERSCOPE_STS_DIR", None)  # the docs' ../shared path is the one read
    failed, took, seen = [], [], set()
    for example in _all_examples():
        if example.code in SKIPPED or example.code in seen:  # the same command again reuses its result: run once
            continue
        seen.add(example.code)
        start = time.perf_counter()
        code, tail = _run(example, work, env)
        took.append(f"{time.perf_counter() - start:6.1f} s  {example.doc}:{example.line} {example.code[:90]!r}")
        if code != 0:
            failed.append(f"{example.doc}:{example.line}: {example.code!r} exited {code}:\n{tail}")
    print("\n".join(took))  # shown with -s, or with a failure: what each example took
    assert not failed, "\n\n".join(failed)
    ran = len(took)
    assert ran >= 25
    # what the README's own Python line reads is the model's own embedding: unit length (normalize), one row a text
    got = subprocess.run([sys.executable, "-c", 'from layerscope import LayerStore\nimport numpy as np\n'
                          'v = LayerStore.open("store")["st", -1]\nprint(v.shape[0], np.linalg.norm(v, axis=1).min())'],
                         cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert int(got[0]) == len(CORPUS) and abs(float(got[1]) - 1.0) < 1e-5


def test_layerstore_imports_from_the_top_and_import_layerscope_stays_light():
    """Catches: ``from layerscope import LayerStore`` failing, and a top-level import that loads numpy or torch."""
    code = ("import sys, layerscope\n"
            "heavy = sorted(m for m in ('numpy', 'torch', 'onnxruntime', 'transformers') if m in sys.modules)\n"
            "from layerscope import LayerStore, embed, extract\n"
            "from layerscope.store.store import LayerStore as Deep\n"
            "print(heavy, LayerStore is Deep, 'LayerStore' in dir(layerscope))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True", "True"]
    import layerscope

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        layerscope.Nope  # noqa: B018


def test_a_pooling_the_store_lacks_is_refused_naming_what_it_holds_in_words(tmp_path):
    """Catches: an error that says only 'it holds st', which a reader of the README cannot act on."""
    from layerscope.errors import StoreError
    from layerscope.store.store import LayerStore

    manifest = {"num_layers": 2, "hidden_size": 4, "family": "bert", "source": {"spec": "m", "path_or_id": "m"},
                "sentence_transformers": {"pooling": "mean", "normalize": True, "supported": True}}
    from layerscope.store.store_spec import StoreSpec

    store = LayerStore.create(tmp_path / "s", n=2, spec=StoreSpec.bare(["2"], ["st", "cls"]), hidden_size=4,
                              manifest=manifest)
    with pytest.raises(StoreError) as err:
        store["mean", -1]
    assert str(err.value) == (
        f"pooling 'mean' is not in {tmp_path / 's'} (it holds st: the checkpoint's own recipe, mean pooling + "
        "normalize; cls); ask for one of those, or extract again with --pooling st,cls,mean to store mean too")
    assert np.asarray(store["st", -1]).shape == (2, 4)
