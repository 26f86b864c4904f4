"""The table of a process-isolated bench (``bench.md``): speed, accuracy class, peak fraction, time split."""

from __future__ import annotations

from typing import Any


def _f(value, fmt: str, none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def _split(split: dict[str, Any] | None) -> str:
    if not split:
        return "-"
    keys = ("tokenize_s", "engine_s", "pool_copy_s", "write_s")
    return " / ".join(_f(split.get(k), ".2f") for k in keys)


def _tokenizer(how: str | None) -> str:
    if not how:
        return "-"
    if how.split(" ", 1)[0].isdigit():
        return f"{how.split(' ', 1)[0]} processes"
    return "parallel" if how.startswith("parallel") else "1 thread"


def _gpu_mib(mem: dict[str, Any] | None) -> str:
    if not mem:
        return "-"
    if mem.get("peak_mib") is None:
        return "not measured"
    return f"{mem['peak_mib']:,.0f} ({'torch' if mem['source'].startswith('torch') else 'NVML'})"


def _padding(r: dict[str, Any]) -> str:
    """Tokens/s of the texts and of the batches as run (padding included), and padding's share of the latter."""
    if r.get("padded_tokens_per_s") is None:
        return "-"
    return (f"{r['real_tokens_per_s']:,.0f} / {r['padded_tokens_per_s']:,.0f} "
            f"({100 * (r.get('padding_share') or 0.0):.1f}%)")


def final_only(row: dict[str, Any], all_layers: list[str]) -> bool:
    """A row that produced the final layer only (sentence-transformers peers), not every layer."""
    layers = row.get("layers") or []
    return row.get("kind") == "peer" or (len(all_layers) > 1 and len(layers) == 1)


def isolated_table(bench: dict[str, Any]) -> str:
    s, m = bench["settings"], bench["machine"]
    peak = m.get("peak")
    final = s["layers"][-1]
    loads = m.get("load_avg_1m_at_starts") or []
    lines = [
        f"Model `{bench['model']['source']}` ({bench['model']['family']}, {bench['model']['num_layers']} layers, "
        f"shapes {bench['model'].get('shapes')}), corpus {bench['corpus']['name']} ({bench['corpus']['texts']:,} "
        f"texts, {bench['corpus']['tokens_unpadded']:,} tokens), layers {s['layers'][0]}..{final} "
        f"{s['pooling']}-pooled; {m['cpu_model']}, {m['usable_cores']} cores; each row in its own process, "
        f"{s['rounds']} rounds (alternating order) x {s['passes']} warm passes.",
        "",
        f"Compute peak: {peak['text'] if peak else 'unknown (no /proc/cpuinfo)'}; "
        f"useful work {_f(bench['corpus'].get('flops') and bench['corpus']['flops'] / 1e9, ',.1f')} GFLOP per pass "
        "(matmuls and attention of every layer, no padding).",
        f"Load average (1 min) at each process start: {', '.join(f'{v:.1f}' for v in loads) or '-'}.",
        "",
        "| row | layers | texts/s best | texts/s median | tokens/s real / padded (padding) | rounds agree (bests) | "
        "x best peer as accurate | x hf-eager | accuracy class (min cos, layer) | % of peak real / padded (peak) | "
        "split s: tokenize / engine / pool-copy / write | tokenizer | STS final | STS worst drop (layer) | "
        "peak RSS MiB | peak GPU MiB |",
        "|---|---|---:|---:|---:|---|---:|---:|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in bench["results"]:
        if not r.get("available"):
            continue
        acc = r.get("accuracy") or {}
        worst_layer = min(acc, key=lambda k: acc[k]["min_cos"]) if acc else None
        layers = r.get("layers") or []
        layer_text = "all" if layers == s["layers"] else ",".join(layers)
        if final_only(r, s["layers"]):
            layer_text = f"**final only** ({layer_text})"
        bests = "/".join(f"{v:,.0f}" for v in r.get("round_best_texts_per_s") or [])
        sts = r.get("sts_spearman") or {}
        delta = r.get("sts_spearman_delta") or {}
        drop = min(delta.items(), key=lambda kv: kv[1]) if delta else None
        peer = r.get("best_peer_as_accurate")
        lines.append(
            f"| {r['engine']} | {layer_text} | {r['texts_per_s']:,.0f} | {r['median_texts_per_s']:,.0f} | "
            f"{_padding(r)} | {'yes' if r['rounds_agree'] else 'no'} ({bests}) | "
            f"{_f(r.get('x_best_peer_as_accurate'), '.2f')}{f' ({peer})' if peer else ''} | "
            f"{_f(r.get('x_hf_eager'), '.2f')} | {r.get('accuracy_class', '-')} "
            f"({_f(r.get('min_cos'), '.6f')}{f', {worst_layer}' if worst_layer else ''}) | "
            f"{_f(r.get('peak_fraction') and 100 * r['peak_fraction'], '.1f')} / "
            f"{_f(r.get('peak_fraction_padded') and 100 * r['peak_fraction_padded'], '.1f')} "
            f"({r.get('peak_label', '-')}) | "
            f"{_split(r.get('split'))} | {_tokenizer(r.get('tokenization'))} | {_f(sts.get(final), '.2f')} | "
            + (f"{drop[1]:+.2f} ({drop[0]})" if drop else "-")
            + f" | {r['peak_rss_mib']:,.0f} | {_gpu_mib(r.get('gpu_memory'))} |")
    gpu_peaks = {r["peak_text"] for r in bench["results"] if r.get("available") and r.get("peak_label", "CPU fp32")
                 != "CPU fp32" and r.get("peak_text")}
    if gpu_peaks:
        lines += ["", "GPU rows are a fraction of their GPU's peak for their precision, not of the CPU's:", ""]
        lines += [f"- {t}" for t in sorted(gpu_peaks)]
        sources = {m["source"] for r in bench["results"] if (m := r.get("gpu_memory"))}
        lines += ["", "Peak GPU MiB: " + "; ".join(sorted(sources)) + "."]
    missing = [r for r in bench["results"] if not r.get("available")]
    if missing:
        lines += ["", "Not run here:", ""]
        lines += [f"- `{r['engine']}`: {r['reason']}" for r in missing]
    if any(final_only(r, s["layers"]) for r in bench["results"] if r.get("available")):
        lines += ["", f"Rows marked **final only** (the sentence-transformers peers) produce the final layer only: "
                  f"1 of the {len(s['layers'])} layers the layerscope rows produce, so their texts/s is not "
                  "the same work."]
    lines += ["", "Accuracy: min cosine to the fp32 torch loop (hf-eager) over the first "
              f"{s['accuracy_rows']:,} texts and every layer the row produced (peers: the final layer). "
              "'x best peer as accurate': against the fastest sentence-transformers row whose min cosine "
              "reaches this row's class. Split: layerscope rows, one extra sequential pass (no tokenizer thread) "
              "writing a LayerStore; hf-eager, inside its last timed pass; peers, a tokenize-only pass, the rest "
              "of the best pass counted as engine (with their pooling); hf-eager and peers write nothing. "
              "Tokens/s real counts the texts' tokens, padded the batches' texts x padded width as the engine ran "
              "them (layerscope rows: length-sorted token-budget batches; hf-eager: corpus order), with padding's "
              "share; % of peak likewise: the useful FLOPs (no padding) and the FLOPs of the padded batches."]
    return "\n".join(lines) + "\n"
