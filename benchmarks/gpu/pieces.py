"""Carry files to a machine that cannot download, in loads that each fit one transfer.

    python benchmarks/gpu/pieces.py split FILE... --out .gpu --piece-mib 48 --load-mib 56
        cuts every file into pieces of at most --piece-mib, packs the pieces into folders
        .gpu/load-1, .gpu/load-2, ... of at most --load-mib each, and writes .gpu/plan.json
        (each file's name, size, sha256 and its pieces in order). plan.json goes into every load.
    python benchmarks/gpu/pieces.py receive LOAD_DIR --into DIR
        (on the far machine) copies one load's pieces into DIR, which outlives the call.
    python benchmarks/gpu/pieces.py join DIR --out WHEELS [--only GLOB] [--skip GLOB]
        joins every file of the plan (or those whose names match --only and not --skip) from its
        pieces in DIR, checks size and sha256, and says in one line which load to send again when a
        piece is missing or damaged. Files that arrive first can be used while the rest travel.

Standard library only: it runs on the far machine before anything is installed there.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import shutil
import sys
from pathlib import Path

PLAN = "plan.json"
MIB = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def split(files: list[Path], out: Path, *, piece_bytes: int, load_bytes: int) -> dict:
    if piece_bytes > load_bytes:
        raise SystemExit(f"a piece ({piece_bytes:,} bytes) must fit in a load ({load_bytes:,} bytes)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    plan: dict = {"files": [], "loads": 0}
    load, used = 0, load_bytes  # the first piece opens load 1
    for path in files:
        entry = {"name": path.name, "size": path.stat().st_size, "sha256": _sha256(path), "pieces": []}
        with open(path, "rb") as fh:
            k = 0
            while True:
                data = fh.read(piece_bytes)
                if not data and k:
                    break
                if load == 0 or used + len(data) > load_bytes:
                    load, used = load + 1, 0
                    (out / f"load-{load}").mkdir()
                piece = f"{path.name}.part{k:03d}"
                (out / f"load-{load}" / piece).write_bytes(data)
                entry["pieces"].append({"load": load, "name": piece, "size": len(data)})
                used += len(data)
                k += 1
                if len(data) < piece_bytes:
                    break
        plan["files"].append(entry)
    plan["loads"] = load
    text = json.dumps(plan, indent=1)
    (out / PLAN).write_text(text)
    for i in range(1, load + 1):
        (out / f"load-{i}" / PLAN).write_text(text)
    return plan


def receive(load_dir: Path, into: Path) -> int:
    into.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(load_dir.iterdir()):
        shutil.copyfile(f, into / f.name)
        n += f.name != PLAN
    return n


def join(pieces: Path, out: Path, only: str | None = None, skip: str | None = None) -> list[Path]:
    plan = json.loads((pieces / PLAN).read_text())
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for entry in plan["files"]:
        if (only and not fnmatch.fnmatch(entry["name"], only)) or (skip and fnmatch.fnmatch(entry["name"], skip)):
            continue
        target = out / entry["name"]
        with open(target, "wb") as fh:
            for p in entry["pieces"]:
                src = pieces / p["name"]
                if not src.is_file() or src.stat().st_size != p["size"]:
                    raise SystemExit(f"{p['name']} of {entry['name']} is missing or cut: send load-{p['load']} again")
                with open(src, "rb") as part:
                    shutil.copyfileobj(part, fh)
        if target.stat().st_size != entry["size"] or _sha256(target) != entry["sha256"]:
            loads = sorted({p["load"] for p in entry["pieces"]})
            raise SystemExit(f"{entry['name']} does not match its sha256 once joined: send "
                             f"load-{', load-'.join(map(str, loads))} again")
        made.append(target)
    return made


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("files", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--piece-mib", type=float, default=8)
    s.add_argument("--load-mib", type=float, default=56)
    r = sub.add_parser("receive")
    r.add_argument("load_dir", type=Path)
    r.add_argument("--into", type=Path, required=True)
    j = sub.add_parser("join")
    j.add_argument("pieces", type=Path)
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--only", help="join only the files whose names match this glob")
    j.add_argument("--skip", help="leave out the files whose names match this glob")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        plan = split(a.files, a.out, piece_bytes=int(a.piece_mib * MIB), load_bytes=int(a.load_mib * MIB))
        print(f"{len(plan['files'])} files in {plan['loads']} loads under {a.out}")
    elif a.cmd == "receive":
        print(f"{receive(a.load_dir, a.into)} pieces from {a.load_dir} in {a.into}")
    else:
        made = join(a.pieces, a.out, a.only, a.skip)
        print(f"{len(made)} files joined and checked in {a.out}")


if __name__ == "__main__":
    sys.exit(main())
