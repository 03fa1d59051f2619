"""CUDA source -> cubin with NVRTC, the compiler's resource report, and a disk cache.

NVRTC is reached through CuPy's thin binding, which works without a GPU or a driver
(``cupy.RawModule`` does not: it asks the driver for the device).  No CUDA headers are
used: fp16 conversions and tensor-core instructions are inline PTX, so the options
carry no ``-I`` and the build is the same on every machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from . import __version__
from .errors import SpecError
from .files import atomic_write

DEFAULT_ARCH = "sm_90"
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v")
# A template that defines its launch bounds under this macro offers a second choice,
# which the compile step takes when the first one spills.
ALT_BOUNDS = "SPECGEN_ALT_BOUNDS"


@dataclass(frozen=True)
class Resources:
    """ptxas's report for one kernel."""

    registers: int
    smem: int  # static shared bytes
    stack: int
    spill_stores: int
    spill_loads: int
    cmem: int  # bytes in user constant banks (__constant__ arrays)

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass(frozen=True)
class Binary:
    cubin: bytes
    arch: str
    resources: dict  # kernel symbol -> Resources
    key: str
    log: str
    defines: tuple[str, ...] = ()  # macros the source was compiled with (ALT_BOUNDS)

    @property
    def spills(self) -> int:
        return sum(r.spills + r.stack for r in self.resources.values())


def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())


def cache_dir() -> Path:
    env = os.environ.get("SPECGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specgen"


def options_for(arch: str) -> tuple[str, ...]:
    """NVRTC 12.9 and later keep their own cache of compiled programs, and a hit there
    returns an empty log: no ptxas report, so no registers or spills to check (seen on
    the H200 with NVRTC 13.0 when a source differed from an earlier one only in its
    comments).  specgen caches the outcome itself, so NVRTC's cache is turned off."""
    own_cache = ("--no-cache",) if nvrtc_version() >= (12, 9) else ()
    return (f"--gpu-architecture={arch}",) + BASE_OPTIONS + own_cache


def cache_key(source: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (
        source,
        "\0".join(options_for(arch)),
        arch,
        "nvrtc %d.%d" % nvrtc_version(),
        "specgen " + __version__,
    ):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")


def symbol_sizes(cubin: bytes) -> dict[str, int]:
    """Sizes of the named objects in a cubin's ELF symbol table (``wc``, ``koff``...).

    ptxas run through NVRTC does not report module-scope __constant__ bytes, so the
    size of each constant array is read off the binary itself.
    """
    import struct

    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)
    ]
    out = {}
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            name_off, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", cubin, off)
            if size and (info & 0xF) == 1:  # STT_OBJECT
                start = strtab[4] + name_off
                name = cubin[start : cubin.index(b"\0", start)].decode()
                out[name] = size
    return out


def parse_resources(log: str) -> dict[str, Resources]:
    """Read ptxas -v's lines for each entry function out of NVRTC's log."""
    out: dict[str, Resources] = {}
    current, frame = None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and current:
            frame = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current:
            rest = m.group(2)
            smem = _SMEM.search(rest)
            # cmem[0] holds kernel parameters; user __constant__ data sits in bank 3.
            cmem = sum(int(n) for n, bank in _CMEM.findall(rest) if bank != "0")
            out[current] = Resources(
                registers=int(m.group(1)),
                smem=int(smem.group(1)) if smem else 0,
                stack=frame[0],
                spill_stores=frame[1],
                spill_loads=frame[2],
                cmem=cmem,
            )
            current = None
    return out


def _nvrtc_compile(source: str, name: str, arch: str, defines=()) -> tuple[bytes, str]:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options_for(arch)) + [f"-D{d}" for d in defines])
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise RuntimeError(f"NVRTC failed to compile {name}: {e}\n{log}") from None
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _load_cached(base: Path, key: str, arch: str) -> Binary | None:
    try:
        meta = json.loads((base / f"{key}.json").read_text())
        cubin = (base / f"{key}.cubin").read_bytes()
        if hashlib.sha256(cubin).hexdigest() != meta["cubin_sha256"]:
            return None
        resources = {k: Resources(**r) for k, r in meta["resources"].items()}
        return Binary(cubin, arch, resources, key, meta["log"], tuple(meta["defines"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or corrupt: compile again


def compile_source(source: str, name: str, arch: str = DEFAULT_ARCH, cache: bool = True) -> Binary:
    """Compile (or fetch from the cache) and return the cubin with its resource report.

    When the source offers a second choice of launch bounds (``ALT_BOUNDS``) and the
    first spills, it is compiled again with the second, and the one with fewer spilled
    bytes is kept: the cache holds the outcome, so the retry is paid once."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise SpecError(f"malformed architecture '{arch}'; write sm_XX, for example sm_90")
    key = cache_key(source, arch)
    base = cache_dir() / arch
    if cache and (hit := _load_cached(base, key, arch)):
        return hit
    cubin, log = _nvrtc_compile(source, name, arch)
    binary = Binary(cubin, arch, parse_resources(log), key, log)
    if binary.spills and f"#ifndef {ALT_BOUNDS}" in source:
        cubin, log = _nvrtc_compile(source, name, arch, (ALT_BOUNDS,))
        alt = Binary(cubin, arch, parse_resources(log), key, log, (ALT_BOUNDS,))
        if alt.spills < binary.spills:
            binary = alt
    if cache:
        meta = dict(
            name=name,
            arch=arch,
            cubin_sha256=hashlib.sha256(cubin).hexdigest(),
            resources={k: asdict(r) for k, r in binary.resources.items()},
            log=binary.log,
            defines=list(binary.defines),
        )
        atomic_write(base / f"{key}.cubin", cubin)  # the cubin first: meta names it
        atomic_write(base / f"{key}.json", json.dumps(meta, indent=1).encode())
    return binary
