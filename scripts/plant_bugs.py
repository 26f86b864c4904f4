#!/usr/bin/env python
"""Plant listed one-line bugs, one at a time, in a temporary copy of the tree and see which the tests catch.

Each bug names a file, one exact line of it (it must occur exactly once, whitespace included) and the
line that replaces it, and the tests that ought to notice (files or node ids, run with ``-m "not slow"``
unless ``--slow``). For each bug the copy gets that one change, pytest runs the bug's tests, the file is
put back, and a table says caught (pytest failed), survived (pytest passed: no test noticed), or error
(the line was not found, or pytest could not run). A baseline run without any bug (``--baseline``)
checks that the chosen tests pass on the clean tree first.

Not part of CI (it runs pytest once per bug). Run it before and after a change to the tests, e.g.:

    python scripts/plant_bugs.py                          # every bug, this tree
    python scripts/plant_bugs.py --root /tmp/main-tree    # the same bugs against another tree's tests
    python scripts/plant_bugs.py --only range-offsets,lease-from-start --baseline

A test file listed for a bug that the tree does not have is left out of that bug's run (and said so).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bug:
    name: str
    file: str  # relative to the tree's root
    original: str  # one whole line of ``file``, exactly (leading spaces included)
    replacement: str
    tests: tuple[str, ...]  # pytest arguments: files or node ids, relative to the tree's root


S = "src/layerscope/"
FM = "tests/test_force_owned.py::"  # an index and its store
BUGS = (
    # ---- data loss and path safety
    Bug("ownership-size-only", S + "owned_record.py",
        '        return sig["bytes"] == rec.get("bytes") and file_sha256(p) == rec["sha256"]',
        '        return sig["bytes"] == rec.get("bytes")',
        ("tests/test_ownership_guards.py", "tests/test_force_owned.py", "tests/test_user_files.py")),
    Bug("store-writer-before-empty", S + "store/store_lock.py",
        "        before = not_layerscopes(store_dir)",
        "        before = []",
        ("tests/test_ownership_guards.py", "tests/test_force_owned.py", "tests/test_user_files.py")),
    Bug("writer-in-place-before-empty", S + "ownership.py",
        "    before = not_layerscopes(path)",
        "    before = []",
        ("tests/test_ownership_guards.py", "tests/test_force_owned.py", "tests/test_user_files.py")),
    Bug("safe-part-leading-dots", S + "ownership.py",
        '    part = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text)).strip("-.")',
        '    part = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text)).strip("-")',
        ("tests/test_ownership_guards.py", "tests/test_force_owned.py", "tests/test_report_paths.py")),
    # ---- silently wrong figures
    Bug("cache-key-no-variant", S + "analyses/cache.py",
        '        "onnx": run.handle.manifest.onnx_sha256, "variant": getattr(run.engine, "variant", None),',
        '        "onnx": run.handle.manifest.onnx_sha256,',
        ("tests/analyses/test_identity_guards.py", "tests/test_export_cache.py", "tests/analyses/test_run_spec.py", "tests/test_variants.py")),
    Bug("cache-holder-any-pooling", S + "analyses/cache.py",
        "    return next((s for s in stores if layer in s.layers and pooling in s.poolings), None)",
        "    return next((s for s in stores if layer in s.layers), None)",
        ("tests/analyses/test_run_depth.py", "tests/analyses/test_identity_guards.py", "tests/analyses/test_run_spec.py")),
    Bug("spec-no-variant", S + "analyses/spec.py",
        '            ident.update({f"{where}.weights": m.key, f"{where}.engine": m.engine, f"{where}.variant": m.variant,',
        '            ident.update({f"{where}.weights": m.key, f"{where}.engine": m.engine,',
        ("tests/analyses/test_identity_guards.py", "tests/analyses/test_run_spec.py", "tests/test_results_layout.py")),
    Bug("spec-no-batch-tokens", S + "analyses/spec.py",
        '                                 "max_length": self.max_length, "batch_tokens": self.batch_tokens,',
        '                                 "max_length": self.max_length,',
        ("tests/analyses/test_identity_guards.py", "tests/analyses/test_run_spec.py", "tests/test_results_layout.py")),
    Bug("spec-options-as-given", S + "analyses/base.py",
        "        spec = RunSpec.asked(meta.name, request, options=opts, engine_options=engine_options, data=data,",
        "        spec = RunSpec.asked(meta.name, request, options=given, engine_options=engine_options, data=data,",
        ("tests/analyses/test_identity_guards.py", "tests/analyses/test_run_spec.py", "tests/test_results_layout.py")),
    Bug("word-context-last-k-shifted", S + "analyses/word_context.py",
        "        last = [str(i) for i in range(run.num_layers - k_last + 1, run.num_layers + 1)]",
        "        last = [str(i) for i in range(run.num_layers - k_last, run.num_layers)]",
        ("tests/analyses/test_token_analyses.py",)),
    Bug("token-spans-not-shifted-by-prompt", S + "model/tokenize.py",
        "        spans = offsets - len(self.prompt)",
        "        spans = offsets",
        ("tests/store/test_token_store.py", "tests/analyses/test_token_analyses.py")),
    Bug("range-offsets-by-range-number", S + "store/store_ranges.py",
        "    return [Range(k, start, min(n, start + rows), int(offsets[start // GRANULE]))",
        "    return [Range(k, start, min(n, start + rows), int(offsets[k]))",
        ("tests/extraction/test_range_guards.py", "tests/extraction/test_shard_extract.py")),
    Bug("range-lengths-item-size", S + "extraction/range_writer.py",
        "        offset = self._data_offset(LENGTHS) + r.start * 4",
        "        offset = self._data_offset(LENGTHS) + r.start * item",
        ("tests/extraction/test_range_guards.py", "tests/extraction/test_shard_extract.py")),
    Bug("graph-last-float-index", S + "vocab/pooling.py",
        '        weighted = self.b.node("Mul", [self.mask_input, pos1], f"{self.hint}_last_pos")',
        '        weighted = self.b.node("Mul", [self.mask(), self._float(pos1, "pos1f")], f"{self.hint}_last_pos")',
        ("tests/test_vocab_pooling_parity.py",)),
    Bug("half-store-bars-loosened", S + "store/store_dtype.py",
        'MIN_COSINE = {"float16": 0.99999, "bfloat16": 0.9999}',
        'MIN_COSINE = {"float16": 0.999, "bfloat16": 0.99}',
        ("tests/test_store_dtype.py", "tests/extraction/test_shard_extract.py")),
    # ---- durability and scale-out
    Bug("done-mark-without-fsync", S + "store/store_ranges.py",
        "        os.fsync(fh.fileno())",
        "        pass",
        ("tests/extraction/test_range_guards.py", "tests/extraction/test_shard_extract.py")),
    Bug("token-rows-committed-before-flush", S + "store/token_write.py",
        "        self.writer.flush()  # tokens on disk first: a row is marked done only once all of it is durable",
        "        pass",
        ("tests/store/test_token_store.py", "tests/store/test_store_commit_order.py")),
    Bug("finish-with-a-dead-workers-range", S + "store/store_ranges.py",
        "        return not (self.claimed or self.stale or self.missing)",
        "        return not (self.claimed or self.missing)",
        ("tests/extraction/test_range_guards.py", "tests/extraction/test_shard_extract.py")),
    Bug("lease-from-start", S + "store/store_ranges.py",
        "        touched = path.stat().st_mtime",
        '        touched = (info or {}).get("since", path.stat().st_mtime)',
        ("tests/extraction/test_range_guards.py", "tests/extraction/test_shard_extract.py")),
    # ---- images
    Bug("image-mean-counts-registers", S + "model/families.py",
        '    return cls + int(getattr(vision_config, "num_register_tokens", 0) or 0)',
        '    return cls',
        ("tests/export/test_vision_export.py", "tests/extraction/test_image_extract.py")),
    Bug("image-rows-out-of-order", S + "extraction/image_extract.py",
        "            store.write(index, eng.run(batch, chosen, modes), chosen)",
        "            store.write(index[::-1], eng.run(batch, chosen, modes), chosen)",
        ("tests/extraction/test_image_extract.py",)),
    Bug("crossmodal-null-keeps-pairing", S + "metrics/crossmodal.py",
        '                nulls["mutual_knn"].append(_overlap(nn_a[i], inv[nn_b[j][p]]).mean())',
        '                nulls["mutual_knn"].append(_overlap(nn_a[i], nn_b[j]).mean())',
        ("tests/metrics/test_crossmodal.py",)),
    Bug("vision-lens-no-final-norm", S + "analyses/vision_lens.py",
        "                return self.head(self.norm(x)).numpy()",
        "                return self.head(x).numpy()",
        ("tests/analyses/test_vision_lens.py",)),
    # ---- export memory, model families
    Bug("stream-only-over-external-limit", S + "export/exporter.py",
        "    return min(EXTERNAL_DATA_BYTES, lean.STREAM_BYTES)",
        "    return EXTERNAL_DATA_BYTES",
        ("tests/export/test_trace_in_child.py",)),
    Bug("torch-lens-whole-batch", S + "analyses/lens.py",
        "                out = torch_lens(model, inputs, all_layers, k, hidden, positions=step, bar=bar, divergence=True)",
        "                out = torch_lens(model, inputs, all_layers, k, hidden, bar=bar, divergence=True)",
        ("tests/decoding/test_lens_streaming.py",)),
    Bug("gqa-window-less-one", S + "export/gqa.py",
        "            ({\"local_window_size\": shape.window} if shape.window is not None else {})",
        "            ({\"local_window_size\": shape.window - 1} if shape.window is not None else {})",
        ("tests/export/test_gqa_families.py",)),
    Bug("deberta-scripted-branch", S + "export/traceable.py",
        '        if deberta is not None and hasattr(deberta, "build_rpos"):',
        "        if False:",
        ("tests/export/test_deberta_openvino.py",)),
    Bug("heatmap-scale-not-widened", S + "report/declared_grids.py",
        "    return (min([*(g.spec.scale[0] for g in scaled), *values]), max([*(g.spec.scale[1] for g in scaled), *values]))",
        "    return (min(g.spec.scale[0] for g in scaled), max(g.spec.scale[1] for g in scaled))",
        ("tests/report/test_declared_grids.py",)),
    Bug("bars-one-group-per-model", S + "report/declared_grids.py",
        "                named = fill(spec.group, r, str) if \"{\" in spec.group else str(r.get(spec.group))",
        "                named = model",
        ("tests/report/test_declared_grids.py",)),
    # ---- crossmodal: the built-in pairs and retrieval both ways
    Bug("crossmodal-digit-previous-caption", S + "analyses/crossmodal.py",
        '        pairs.append((f"digit-{i}", buf.getvalue(), f"a photo of the digit {WORDS[int(digits.target[i])]}"))',
        '        pairs.append((f"digit-{i}", buf.getvalue(), f"a photo of the digit {WORDS[int(digits.target[i - 1])]}"))',
        ("tests/analyses/test_crossmodal_run.py",)),
    Bug("crossmodal-b-rank-wrong-axis", S + "metrics/crossmodal.py",
        "    b_rank = (s > diag[None, :]).sum(axis=0)",
        "    b_rank = (s > diag[None, :]).sum(axis=1)",
        ("tests/metrics/test_crossmodal.py",)),
    Bug("crossmodal-anchor-also-query", S + "metrics/crossmodal.py",
        "    anchors, queries = np.sort(order[: n // 2]), np.sort(order[n // 2:])",
        "    anchors, queries = np.sort(order[: n // 2 + 1]), np.sort(order[n // 2:])",
        ("tests/metrics/test_crossmodal.py",)),
    Bug("crossmodal-directions-swapped", S + "metrics/crossmodal.py",
        "    return (a_rank < acc_k).astype(float), (b_rank < acc_k).astype(float)",
        "    return (b_rank < acc_k).astype(float), (a_rank < acc_k).astype(float)",
        ("tests/metrics/test_crossmodal.py",)),
    # ---- an index's record of its store, the vector cache key
    Bug("index-identity-wrong-array-name", S + "index/store_index.py",
        "    rel = array_rel(pooling, layer)",
        "    rel = array_rel(layer, pooling)",
        (FM + "test_an_index_refuses_a_store_made_again_from_the_same_texts_with_other_settings",
         FM + "test_an_index_needs_its_arrays_checksum_on_both_sides",
         FM + "test_an_index_refuses_a_store_that_changed_since")),
    Bug("index-identity-texts-for-array", S + "index/store_index.py",
        "                         n=store.n, texts_sha256=store.file_sha256(TEXTS), array_sha256=array)",
        "                         n=store.n, texts_sha256=store.file_sha256(TEXTS), array_sha256=store.file_sha256(TEXTS))",
        (FM + "test_an_index_refuses_a_store_made_again_from_the_same_texts_with_other_settings",
         FM + "test_an_index_needs_its_arrays_checksum_on_both_sides",
         FM + "test_an_index_refuses_a_store_that_changed_since")),
    Bug("cache-key-no-remote-code", S + "analyses/cache.py",
        '        "remote_code": bool(getattr(run.handle, "trust_remote_code", False)),',
        "",
        ("tests/analyses/test_identity_guards.py",)),
    Bug("cache-key-remote-code-wrong-name", S + "analyses/cache.py",
        '        "remote_code": bool(getattr(run.handle, "trust_remote_code", False)),',
        '        "remote_code": bool(getattr(run.handle, "remote_code", False)),',
        ("tests/analyses/test_identity_guards.py",)),
    # ---- positions after the pad id, image geometry, ranks
    Bug("positions-after-pad-off-by-one", S + "model/families.py",
        '        max_len -= int(getattr(cfg, "pad_token_id", None) or 0) + 1  # positions start after the padding index',
        '        max_len -= int(getattr(cfg, "pad_token_id", None) or 0)  # positions start after the padding index',
        ("tests/test_families_table.py",)),
    Bug("image-grid-wrong-divisor", S + "extraction/image_tokens.py",
        "    r, c = np.divmod(np.arange(rows * cols, dtype=np.int32), cols)",
        "    r, c = np.divmod(np.arange(rows * cols, dtype=np.int32), rows)",
        ("tests/extraction/test_image_geometry.py", "tests/extraction/test_image_tokens.py")),
    Bug("image-grid-rows-cols-swapped", S + "extraction/image_tokens.py",
        "    rows, cols = image.height // image.patch_size, image.width // image.patch_size",
        "    rows, cols = image.width // image.patch_size, image.height // image.patch_size",
        ("tests/extraction/test_image_geometry.py", "tests/extraction/test_image_tokens.py")),
    Bug("cls-maps-rows-cols-swapped", S + "analyses/cls_attention.py",
        "        rows, cols = image.height // image.patch_size, image.width // image.patch_size",
        "        rows, cols = image.width // image.patch_size, image.height // image.patch_size",
        ("tests/export/test_vision_image_size.py::test_cls_maps_lie_on_a_grid_wider_than_high",
         "tests/analyses/test_cls_attention.py")),
    Bug("image-mean-float32", S + "vocab/image_pooling.py",
        "        return states[..., prefix:, :].astype(np.float64).mean(axis=-2).astype(np.float32)",
        "        return states[..., prefix:, :].mean(axis=-2).astype(np.float32)",
        ("tests/extraction/test_image_geometry.py",)),
    Bug("tied-mean-rank-half-low", S + "metrics/ties.py",
        "        return np.asarray(self.above, dtype=np.float64) + (np.asarray(self.tied, dtype=np.float64) + 1.0) / 2.0",
        "        return np.asarray(self.above, dtype=np.float64) + np.asarray(self.tied, dtype=np.float64) / 2.0",
        ("tests/metrics/test_tied_ranks.py",)),
    # ---- declared figures, the suite's home
    Bug("declared-heatmap-path", S + "analyses/crossmodal.py",
        '    heatmaps=tuple(HeatMap(f"figures.{name}.value", f"crossmodal_{name}", title=f"{title}: {{image_model}} vs "',
        '    heatmaps=tuple(HeatMap(f"figures.{name}.values", f"crossmodal_{name}", title=f"{title}: {{image_model}} vs "',
        ("tests/report/test_every_declaration.py",)),
    Bug("declared-sentence-field", S + "analyses/sts.py",
        '    sentence="{pairs:,} pairs. Cosine similarity of the two sentence vectors vs the human score; 95% intervals from "',
        '    sentence="{n_pairs:,} pairs. Cosine similarity of the two sentence vectors vs the human score; 95% intervals from "',
        ("tests/report/test_every_declaration.py",)),
    Bug("declared-rows-table-before-dict", S + "report/results.py",
        "        if isinstance(value, dict):",
        "        if isinstance(value, dict) and path not in self.tables:",
        ("tests/report/test_every_declaration.py",)),
    Bug("home-mteb-cache-in-home", "tests/conftest.py",
        'os.environ["MTEB_CACHE"] = str(_SESSION_HOME / "mteb")',
        "",
        ("tests/test_home_untouched.py",)),
    Bug("home-openvino-telemetry-on", "tests/home_env.py",
        '    (home / "intel" / "openvino_telemetry").write_text("0", encoding="utf-8")',
        "",
        ("tests/test_home_untouched.py",)),
)


def _copy_tree(root: Path, dest: Path) -> None:
    skip = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "results", "*.egg-info")
    for name in ("src", "tests", "pyproject.toml", "docs", "README.md", "benchmarks", "scripts"):
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=skip, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def _plant(tree: Path, bug: Bug) -> str | None:
    """Replace the bug's line in ``tree``; the file's original text, or None when the line is not there once."""
    path = tree / bug.file
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line == bug.original]
    if len(hits) != 1:
        return None
    lines[hits[0]] = bug.replacement
    path.write_text("\n".join(lines), encoding="utf-8")
    return text


def _pytest(tree: Path, tests: list[str], args: argparse.Namespace) -> tuple[int, float, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", "-o", "addopts=",
           *([] if args.slow else ["-m", "not slow"]), *(["-k", args.k] if args.k else []), *tests]
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("LAYERSCOPE_HOME", None)  # the suite's conftest gives each session its own
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout)
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired:
        out, rc = "timed out", -1
    tail = [line for line in out.strip().splitlines() if line.strip()]
    failed = [line.split(" - ")[0].split("::", 1)[-1] for line in tail if line.startswith(("FAILED ", "ERROR "))]
    last = tail[-1] if tail else ""
    return rc, time.perf_counter() - t0, last + (f" [{failed[0]}]" if failed else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to copy (default: this one)")
    ap.add_argument("--only", default="", help="comma-separated bug names (default: every bug)")
    ap.add_argument("--tests", nargs="*", help="run these tests for every bug instead of each bug's own")
    ap.add_argument("-k", dest="k", default="", help="pytest's -k expression, e.g. to leave out a CPU-only test")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per bug's pytest run")
    ap.add_argument("--slow", action="store_true", help="include tests marked slow")
    ap.add_argument("--baseline", action="store_true", help="first run each chosen test set on the clean copy")
    ap.add_argument("--list", action="store_true", help="list the bugs and exit")
    args = ap.parse_args(argv)
    bugs = [b for b in BUGS if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in BUGS}
    if unknown:
        print(f"unknown bug names: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.list:
        for b in bugs:
            print(f"{b.name:36} {b.file}\n    - {b.original.strip()}\n    + {b.replacement.strip()}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="plant-bugs-") as tmp:
        tree = Path(tmp) / "tree"
        _copy_tree(args.root.resolve(), tree)
        baselines: dict[tuple[str, ...], str] = {}
        for bug in bugs:
            tests = list(args.tests) if args.tests else [t for t in bug.tests if (tree / t.split("::")[0]).exists()]
            left = [] if args.tests else [t for t in bug.tests if t not in tests]
            if not tests:
                rows.append((bug.name, "error", 0.0, "none of its tests exist in this tree", ""))
                continue
            if args.baseline and tuple(tests) not in baselines:
                rc, _, last = _pytest(tree, tests, args)
                baselines[tuple(tests)] = "" if rc == 0 else f"clean tree fails: {last}"
            original = _plant(tree, bug)
            if original is None:
                rows.append((bug.name, "error", 0.0, f"the line is not in {bug.file} exactly once", ""))
                continue
            try:
                rc, secs, last = _pytest(tree, tests, args)
            finally:
                (tree / bug.file).write_text(original, encoding="utf-8")
            verdict = {0: "survived", 1: "caught"}.get(rc, "error")
            note = baselines.get(tuple(tests), "")
            rows.append((bug.name, verdict, secs, last, " ".join(tests) + (f"  (absent: {' '.join(left)})"
                                                                           if left else "") + (f"  {note}" if note else "")))
            print(f"{bug.name}: {verdict} ({secs:.0f} s) {last}", file=sys.stderr, flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'bug':{width}}  {'result':8}  {'seconds':>7}  pytest's last line | tests run")
    for name, verdict, secs, last, tests in rows:
        print(f"{name:{width}}  {verdict:8}  {secs:7.0f}  {last} | {tests}")
    caught = sum(r[1] == "caught" for r in rows)
    print(f"\n{caught} of {len(rows)} caught, {sum(r[1] == 'survived' for r in rows)} survived, "
          f"{sum(r[1] == 'error' for r in rows)} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
