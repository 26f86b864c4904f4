"""Short names for the models of a run: what tables, legends, titles and reports call each model.

``--label`` names them (one per ``--model``, in order); otherwise an alias keeps its name (``minilm``), a
local folder is called by its last part (``/models/run-7/checkpoint`` -> ``checkpoint``, with as many parent
parts as it takes to tell two folders apart), and a hub id stays as written (``org/name``). The full path
or id is kept in results.json's ``models[label].spec``.
"""

from __future__ import annotations

from pathlib import Path

from layerscope.errors import InputError


def _parts(spec: str) -> list[str] | None:
    """A local folder's path parts, last first; None for a hub id or an alias."""
    path = Path(spec).expanduser()
    if not path.exists():
        return None
    parts = [p for p in path.resolve().parts if p not in ("/", "")]
    return list(reversed(parts)) or None


def _defaults(specs: list[str], aliases: list[str | None]) -> list[str]:
    parts = [None if alias else _parts(spec) for spec, alias in zip(specs, aliases)]
    depth = 1
    while True:
        names = [alias or ("/".join(reversed(p[:depth])) if p else spec)
                 for spec, alias, p in zip(specs, aliases, parts)]
        # two different folders under one name: one more parent part (the same folder twice is numbered below)
        clash = {n for n in names if len({tuple(p or [s]) for m, p, s in zip(names, parts, specs) if m == n}) > 1}
        if not any(n in clash and p and len(p) > depth for n, p in zip(names, parts)):
            break
        depth += 1
    seen: dict[str, int] = {}
    out = []
    for n in names:  # the same model given twice: a number tells the copies apart
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def model_labels(specs: list[str], aliases: list[str | None], given: list[str] | None = None) -> list[str]:
    """One short, distinct name per model (see the module text); ``given`` are the ``--label`` values."""
    if not given:
        return _defaults(list(specs), list(aliases))
    if len(given) != len(specs):
        raise InputError(f"give one --label per --model, in the same order: {len(specs)} model(s), "
                         f"{len(given)} label(s)")
    labels = [str(g).strip() for g in given]
    if any(not g for g in labels):
        raise InputError("a --label is empty; give every model a name")
    dup = sorted({g for g in labels if labels.count(g) > 1})
    if dup:
        raise InputError(f"--label {dup[0]!r} is given to more than one model; labels must differ")
    return labels
