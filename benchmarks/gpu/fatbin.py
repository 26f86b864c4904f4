"""Keep one GPU architecture's kernels in a CUDA shared library, so it travels in fewer loads.

    python benchmarks/gpu/fatbin.py list LIB.so
        every architecture's kernels in the library's ``.nv_fatbin`` section: entries and MiB
    python benchmarks/gpu/fatbin.py keep LIB.so --arch 90 --out SLIM.so
        a copy where each fat binary that holds kernels for ``--arch`` keeps only those (its header's size
        made to match); the bytes freed are zeros, so the file keeps its size and every address, and
        compresses to what the kept kernels weigh. A fat binary with no kernel for ``--arch`` stays as it is.

A fat binary (what ``nvcc`` embeds for each compiled file, registered with the CUDA runtime at load) is a
16-byte header (magic 0xBA55ED50, version, header size, size of the entries) and its entries, each a header
(kind: 1 PTX, 2 cubin; header size; payload size; at byte 28 the ``sm_XY`` architecture as XY) and its
payload. A cubin runs only on GPUs of its own major architecture (sm_80's on an A100, sm_90's on an H100
or H200); the ONNX Runtime CUDA provider carries no PTX to compile for another one, so on an H100/H200 only
the sm_90 entries can ever load. ONNX Runtime GPU 1.31.1's CUDA provider: 218 MiB of kernels for sm_75, 80,
86, 89, 90 and 120, of which 73 MiB are sm_90's.

Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "cubin"}


@dataclass(frozen=True)
class Entry:
    kind: int
    arch: int
    start: int  # offset in the file of the entry's header
    size: int  # header + payload


@dataclass(frozen=True)
class FatBinary:
    start: int  # offset in the file of the fat binary's header
    header_size: int
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        return self.start + self.header_size + sum(e.size for e in self.entries)


def section(data: bytes, name: str) -> tuple[int, int]:
    """(offset, size) of the ELF64 little-endian section ``name``."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strings = heads[shstrndx][4]
    for name_at, _type, _flags, _addr, offset, size in heads:
        end = data.index(b"\0", strings + name_at)
        if data[strings + name_at:end].decode() == name:
            return offset, size
    raise SystemExit(f"no {name} section: not a CUDA library with kernels")


def fat_binaries(data: bytes) -> list[FatBinary]:
    """Every fat binary of the ``.nv_fatbin`` section, in order (each starts 8-byte aligned)."""
    offset, size = section(data, ".nv_fatbin")
    out, pos, end = [], offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:
            pos += 8
            continue
        entries, p, stop = [], pos + header_size, pos + header_size + body
        while p < stop:
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch, = struct.unpack_from("<I", data, p + 28)
            entries.append(Entry(kind, arch, p, entry_header + payload))
            p += entry_header + payload
        if p != stop:
            raise SystemExit(f"the fat binary at {pos:#x} runs past its size: not a layout this script knows")
        out.append(FatBinary(pos, header_size, tuple(entries)))
        pos = (stop + 7) & ~7
    return out


def summary(data: bytes) -> dict[tuple[str, int], tuple[int, int]]:
    """(kind, arch) -> (entries, bytes)."""
    count: collections.Counter = collections.Counter()
    size: collections.Counter = collections.Counter()
    for fb in fat_binaries(data):
        for e in fb.entries:
            key = (KINDS.get(e.kind, str(e.kind)), e.arch)
            count[key] += 1
            size[key] += e.size
    return {k: (count[k], size[k]) for k in sorted(size, key=lambda k: -size[k])}


def keep(data: bytes, arch: int) -> tuple[bytes, int, int]:
    """(the library with each fat binary that has ``arch`` entries cut down to them, fat binaries cut,
    bytes freed). Addresses do not move: the freed bytes become zeros at the end of each fat binary."""
    out = bytearray(data)
    cut = freed = 0
    for fb in fat_binaries(data):
        kept = [e for e in fb.entries if e.arch == arch]
        if not kept or len(kept) == len(fb.entries):
            continue
        body = b"".join(data[e.start:e.start + e.size] for e in kept)
        first = fb.start + fb.header_size
        out[first:first + len(body)] = body
        out[first + len(body):fb.end] = bytes(fb.end - first - len(body))
        struct.pack_into("<Q", out, fb.start + 8, len(body))
        cut += 1
        freed += fb.end - first - len(body)
    return bytes(out), cut, freed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("list")
    s.add_argument("lib", type=Path)
    k = sub.add_parser("keep")
    k.add_argument("lib", type=Path)
    k.add_argument("--arch", type=int, required=True, help="the sm_XY to keep, as XY (90: H100, H200)")
    k.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    data = a.lib.read_bytes()
    if a.cmd == "list":
        for (kind, arch), (n, size) in summary(data).items():
            print(f"{kind} sm_{arch}: {n} entries, {size / 2**20:.1f} MiB")
        return 0
    slim, cut, freed = keep(data, a.arch)
    if not any(e.arch == a.arch for fb in fat_binaries(slim) for e in fb.entries):
        raise SystemExit(f"the library has no sm_{a.arch} kernels")
    a.out.write_bytes(slim)
    print(f"{cut} of {len(fat_binaries(data))} fat binaries cut to sm_{a.arch}: {freed / 2**20:.1f} MiB of other "
          f"architectures' kernels zeroed in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
