"""The headline lines of a GPU run's stage, for ``$OUT/figures.txt`` (benchmarks/gpu/run.sh).

    python benchmarks/gpu/headline.py bench STAGE_DIR WHAT
        one line per row of STAGE_DIR/bench/bench.json (or, for a bench cut short, of the rows it finished:
        STAGE_DIR/rows/*.json): texts/s, x torch fp32 eager, tokens/s real and padded, % of the row's peak
        real / padded, the split tokenize / engine / pool-copy / write, and how it tokenized
    python benchmarks/gpu/headline.py knn RESULTS.json [--reference CPU_RESULTS.json]
        the alignment run's size and seconds; with --reference, whether every figure equals the reference's
        (counts and accuracies exactly, z within 1e-6 of itself, the first principal component's d within 1e-3)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPLIT = ("tokenize_s", "engine_s", "pool_copy_s", "write_s")


def _rows(stage: Path) -> tuple[list[dict], bool]:
    """(rows, whether the bench finished): its summarized results, else the raw results of the rows it ran."""
    done = stage / "bench" / "bench.json"
    if done.exists():
        return [r for r in json.loads(done.read_text())["results"] if r.get("available")], True
    rows = []
    for f in sorted((stage / "rows").glob("*.json")):
        r = json.loads(f.read_text())
        if r.get("available") and r.get("pass_seconds"):
            r["texts_per_s"] = r["texts"] / min(r["pass_seconds"])
            if r.get("batch_shapes"):  # the texts' own tokens are counted by the bench at its end
                r["padded_only_tokens_per_s"] = sum(b * w for b, w in r["batch_shapes"]) / min(r["pass_seconds"])
            rows.append(r)
    return rows, False


def bench_lines(stage: Path, what: str) -> list[str]:
    rows, finished = _rows(stage)
    lines = [f"{what}: {'' if finished else 'cut short, the rows it finished: '}{len(rows)} rows"]
    base = next((r["texts_per_s"] for r in rows if r["engine"] == "torch"), None)
    for r in rows:
        split = r.get("split") or {}
        parts = [f"{r['engine']}: {r['texts_per_s']:,.0f} texts/s"]
        if base and r["engine"] != "torch" and r.get("device", "cpu") != "cpu":
            parts.append(f"{r['texts_per_s'] / base:.2f}x torch fp32 eager")
        if r.get("padded_tokens_per_s"):
            parts.append(f"tokens/s real {r['real_tokens_per_s']:,.0f} / padded {r['padded_tokens_per_s']:,.0f} "
                         f"(padding {100 * r['padding_share']:.1f}%)")
        elif r.get("padded_only_tokens_per_s"):
            parts.append(f"tokens/s padded {r['padded_only_tokens_per_s']:,.0f}")
        if r.get("peak_fraction") is not None:
            padded = r.get("peak_fraction_padded")
            parts.append(f"{100 * r['peak_fraction']:.1f}% real / "
                         f"{'-' if padded is None else f'{100 * padded:.1f}%'} padded of {r.get('peak_label')}")
        if split:
            parts.append("split " + " / ".join("-" if split.get(k) is None else f"{split[k]:.3f}" for k in SPLIT))
        if r.get("tokenization"):
            parts.append(f"tokenizer: {r['tokenization'].split(' (')[0]}")
        lines.append("  " + "; ".join(parts))
    return lines


def _close(a, b, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def knn_lines(results: Path, reference: Path | None) -> list[str]:
    rec = json.loads(results.read_text())
    if not rec.get("alignment"):
        return [f"knn {results}: no alignment figures (cut short?)"]
    a = rec["alignment"][-1]
    out = [f"knn {a['n']:,} pairs: {a['seconds_total']} s in all ({', '.join(f'{k} {v}' for k, v in a['seconds'].items())}); "
           f"z {a['z']['z']:.6f}, acc@1 {a['retrieval']['src2tgt']['acc@1']}, mutual k-NN {a['mutual_knn']['value']}; "
           f"{a['retrieval']['backend']}"]
    if reference is None:
        return out
    ref = json.loads(reference.read_text())["alignment"][-1]
    if ref["n"] != a["n"]:
        return out + [f"  reference has {ref['n']:,} pairs, not {a['n']:,}: not compared"]
    checks = {"z": _close(a["z"]["z"], ref["z"]["z"], 1e-6),
              "z_monte_carlo": _close((a.get("z_monte_carlo") or {}).get("z"), (ref.get("z_monte_carlo") or {}).get("z"), 1e-6),
              "mutual_knn": a["mutual_knn"]["value"] == ref["mutual_knn"]["value"],
              "pca_pc0_abs_d": _close(a.get("pca_pc0_abs_d"), ref.get("pca_pc0_abs_d"), 1e-3)}
    for d in ("src2tgt", "tgt2src"):
        for k in ("acc@1", "acc@10", "mrr"):
            checks[f"{d} {k}"] = a["retrieval"][d][k] == ref["retrieval"][d][k]
    bad = [k for k, ok in checks.items() if not ok]
    return out + ["  equal to the CPU reference in every figure" if not bad else
                  f"  DIFFERS from the CPU reference in: {', '.join(bad)}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("stage", type=Path)
    b.add_argument("what")
    k = sub.add_parser("knn")
    k.add_argument("results", type=Path)
    k.add_argument("--reference", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "bench":
        lines = bench_lines(a.stage, a.what)
    elif not a.results.exists():
        lines = [f"knn: no {a.results} (the run was cut short before its first figure)"]
    else:
        lines = knn_lines(a.results, a.reference)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
