"""Row ranges of a store: the deterministic plan every executor shares, per-range claims and done marks.

A store made for range writers (``extract --shard i/N`` or ``--ray``) is cut into ranges of ``rows``
consecutive rows (a multiple of ``GRANULE``, fixed when the store is made and recorded in ``store.json``),
so shard ``i`` of ``N`` is the same set of rows on every machine and on every retry.

Any number of processes, on any machines that see the store's directory, may work on one store at once.
The files under ``ranges/`` say who does what:

``<k>.claim``  made with ``O_CREAT | O_EXCL`` (atomic on local disks and on NFSv3+), holding host, pid,
               the process's start time and the machine's boot id, a random token, a time and the store's
               identity; the worker touches it while it works. A claim is stale when its process is gone
               (same host: another boot, the pid no longer runs, or it runs a process that started at
               another time, as a reused pid or a container's pid 1 does), when it names another store, or
               when it has not been touched for ``LEASE_S`` seconds (another host). A claim no worker could
               have written (a pid that is not a positive number, not a JSON object) is damaged: stale too.
               A stale claim is taken over by renaming it away first.
``<k>.done``   written (temp file, fsync, rename, directory fsync) only after the range's rows were
               written and fsync'd: its presence means the rows are durable. It names the store it was
               written for; a mark naming another store (one deleted and made again at the same path while a
               writer ran) does not count, and ``verify`` names it.

Claims keep two workers from doing the same work; they are not what keeps the store right. A range
that two workers both compute is written twice with the same bytes, and a range is only ever marked
done after its data is on disk, so a worker killed at any point leaves either a done range or one that
the next claimant redoes whole.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from layerscope.store.range_marks import ClaimRecord, DoneMark, marked_store
from layerscope.store.store_layout import OFFSETS, StoreLayout, range_mark_glob

GRANULE = 256  # rows between recorded byte offsets of texts.jsonl; range sizes are multiples of it
MAX_RANGE_ROWS = 8192
MAX_RANGE_BYTES = 256 << 20  # a range's vectors are held in memory once before they are written
TARGET_RANGES = 64  # about this many ranges per store, so a redone range costs little
LEASE_S = 600.0  # a claim from another host that was not touched for this long is stale


@dataclass(frozen=True)
class Range:
    """Rows ``[start, stop)`` of the store, range number ``k``; ``offset``: where row ``start`` begins in
    texts.jsonl."""

    k: int
    start: int
    stop: int
    offset: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class RangeStatus:
    done: list[int]
    claimed: list[int]  # by a live worker
    stale: list[int]  # claimed by a worker that is gone
    missing: list[int]  # neither done nor claimed

    @property
    def complete(self) -> bool:
        return not (self.claimed or self.stale or self.missing)


def range_rows(n: int, row_bytes: int) -> int:
    """Rows per range for a store of ``n`` rows of ``row_bytes`` bytes each (all arrays of a row)."""
    by_bytes = max(GRANULE, (MAX_RANGE_BYTES // max(1, row_bytes)) // GRANULE * GRANULE)
    rows = math.ceil(n / TARGET_RANGES)
    rows = max(GRANULE, math.ceil(rows / GRANULE) * GRANULE)
    return int(min(rows, MAX_RANGE_ROWS, by_bytes))


def plan(n: int, rows: int, offsets: np.ndarray) -> list[Range]:
    """Every range of a store of ``n`` rows cut every ``rows`` rows (``rows`` a multiple of GRANULE)."""
    if rows <= 0 or rows % GRANULE:
        raise ValueError(f"range rows must be a positive multiple of {GRANULE}, not {rows}")
    return [Range(k, start, min(n, start + rows), int(offsets[start // GRANULE]))
            for k, start in enumerate(range(0, n, rows))]


def shard_ranges(ranges: list[Range], index: int, count: int) -> list[Range]:
    """Shard ``index`` of ``count``: every ``count``-th range from ``index`` (long and short texts spread
    evenly, since neighbouring rows tend to be alike)."""
    return [r for r in ranges if r.k % count == index]


def scan_offsets(out: Path) -> np.ndarray:
    """Offsets of a texts.jsonl spooled without them or without their recorded sha256 (a store begun by an
    older layerscope): derived again from texts.jsonl and saved beside it."""
    from layerscope.store.store_layout import TEXTS

    offsets, pos = [], 0
    with open(out / TEXTS, "rb") as fh:
        for i, line in enumerate(fh):
            if i % GRANULE == 0:
                offsets.append(pos)
            pos += len(line)
    arr = np.asarray(offsets, dtype=np.int64)
    np.save(out / OFFSETS, arr)
    return arr


def load_offsets(out: Path, recorded: Mapping[str, str], n: int) -> np.ndarray:
    """The byte offsets every range reads its texts from: checked against the sha256 recorded when the store
    was made (``recorded``: its ``internal_sha256``; one line when damaged), or derived again from texts.jsonl
    when none was recorded."""
    from layerscope.store.npy_files import load_internal

    if OFFSETS not in recorded:
        return scan_offsets(out)
    return load_internal(out, OFFSETS, recorded, np.dtype(np.int64), (-(-int(n) // GRANULE),))


# ---------------------------------------------------------------- claims and done marks

def _dir(store_dir: Path) -> Path:
    return StoreLayout(store_dir).ranges


def done_path(store_dir: Path, k: int) -> Path:
    return StoreLayout(store_dir).done_mark(k)


def claim_path(store_dir: Path, k: int) -> Path:
    return StoreLayout(store_dir).claim(k)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def boot_id() -> str | None:
    """This machine's boot id (a new one at every boot), or None where the system has none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when it does not run or /proc lacks it."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
    except (OSError, ValueError, IndexError):
        return None


def claim_is_stale(path: Path, *, now: float | None = None, store_id: str | None = None) -> bool:
    """Whether the claim at ``path`` belongs to a worker that is gone, to another store, or is damaged
    (see the module's notes)."""
    doc = _read_json(path)
    try:
        touched = path.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: nothing to take over
    if doc is None:  # half-written by a worker killed inside os.write: stale once the lease is over
        return (now or time.time()) - touched > LEASE_S
    claim = ClaimRecord.read(doc)
    if claim is None:  # damaged: no worker wrote it
        return True
    if store_id and claim.store not in (None, store_id):
        return True  # written for a store deleted since; its writer is refused before each range
    if claim.host == socket.gethostname():
        boot = boot_id()
        if claim.boot and boot and claim.boot != boot:
            return True  # written before this machine last started
        if not _alive(claim.pid):
            return True
        started = start_time(claim.pid)
        return claim.started is not None and started is not None and started != claim.started
    return (now or time.time()) - touched > LEASE_S


@dataclass
class Claim:
    path: Path
    token: str

    def touch(self) -> None:
        """Renew the lease (workers on other hosts judge staleness by the file's mtime)."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            pass

    def held(self) -> bool:
        claim = ClaimRecord.read(_read_json(self.path))
        return claim is not None and claim.token == self.token

    def release(self) -> None:
        if self.held():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def try_claim(store_dir: Path, k: int, store_id: str | None = None) -> Claim | None:
    """Claim range ``k`` of the store ``store_id`` for this process, taking over a stale claim; None when it is
    done or a live worker holds it."""
    _dir(store_dir).mkdir(exist_ok=True)
    path = claim_path(store_dir, k)
    for _ in range(3):
        if is_done(store_dir, k, store_id):
            return None
        token = secrets.token_hex(8)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not claim_is_stale(path, store_id=store_id):
                return None
            stale = _read_json(path)
            moved = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
            try:
                os.rename(path, moved)
            except FileNotFoundError:
                continue  # someone else moved it first; try again
            if _read_json(moved) != stale:  # a fresh claim replaced the stale one meanwhile: put it back
                try:
                    os.link(moved, path)
                except FileExistsError:
                    pass  # yet another claim: at worst two workers write the same bytes
                os.unlink(moved)
                return None
            os.unlink(moved)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(ClaimRecord(socket.gethostname(), os.getpid(), start_time(os.getpid()), boot_id(), token,
                                  time.time(), store_id).to_json(), fh)
        if is_done(store_dir, k, store_id):  # finished by someone between our check and our claim
            os.unlink(path)
            return None
        return Claim(path, token)
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_done(store_dir: Path, k: int, mark: DoneMark) -> None:
    """Record range ``k`` as durable. Call only after its rows were written and fsync'd."""
    final = done_path(store_dir, k)
    final.parent.mkdir(exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(mark.to_json(), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def is_done(store_dir: Path, k: int, store_id: str | None = None) -> bool:
    """Whether range ``k`` has a done mark of the store ``store_id`` (any store's when None)."""
    path = done_path(store_dir, k)
    if not path.exists():
        return False
    return store_id is None or marked_store(_read_json(path)) in (None, store_id)


def foreign_marks(store_dir: Path, store_id: str | None) -> list[int]:
    """Ranges whose done mark names a store other than ``store_id`` (written into a store made again)."""
    if not store_id or not _dir(store_dir).is_dir():
        return []
    found = []
    for path in sorted(_dir(store_dir).glob(range_mark_glob("done"))):
        mark = marked_store(_read_json(path))
        if mark is not None and mark != store_id and path.stem.isdigit():
            found.append(int(path.stem))
    return found


def done_mark(store_dir: Path, k: int) -> DoneMark:
    """Range ``k``'s done mark, read (one that is missing or cannot be parsed records nothing; an ill-typed field
    is one line)."""
    path = done_path(store_dir, k)
    return DoneMark.read(_read_json(path), path, k)


def status(store_dir: Path, ranges: list[Range], done_rows: np.ndarray | None = None,
           store_id: str | None = None) -> RangeStatus:
    """Which ranges are done (a done mark of this store, or every row marked in ``done_rows``), claimed, stale
    or missing."""
    done, claimed, stale, missing = [], [], [], []
    for r in ranges:
        if is_done(store_dir, r.k, store_id) or (done_rows is not None
                                                 and bool(np.asarray(done_rows[r.start:r.stop]).all())):
            done.append(r.k)
        elif claim_path(store_dir, r.k).exists():
            (stale if claim_is_stale(claim_path(store_dir, r.k), store_id=store_id) else claimed).append(r.k)
        else:
            missing.append(r.k)
    return RangeStatus(done, claimed, stale, missing)
