"""CUDA source -> cubin with NVRTC, the compiler's resource report, and a disk cache.

NVRTC is reached through CuPy's thin binding, which works without a GPU or a driver
(``cupy.RawModule`` does not: it asks the driver for the device).  No CUDA headers are
used: fp16 conversions and tensor-core instructions are inline PTX, so the options
carry no ``-I`` and the build is the same on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .errors import SpecError, warn_once
from .files import atomic_write

DEFAULT_ARCH = "sm_90"
OLDEST_SM = 80  # the oldest architecture whose instructions every template may use
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v")
# A template that defines its launch bounds under this macro offers a second choice,
# which the compile step takes when the first one spills.
ALT_BOUNDS = "SPECGEN_ALT_BOUNDS"
# ...and under this one a third, a plain register cap (``__maxnreg__``), tried when the
# second spills too.
REGISTER_CAP = "SPECGEN_REGISTER_CAP"


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


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """The NVRTC this process loaded (asked once: each cache key names it, and the
    question cost a resnet50's first step 0.3 s on the H200's host)."""
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())


def supported_arch(arch: str) -> None:
    """Refuse an architecture NVRTC cannot target, naming the ones it can."""
    from cupy_backends.cuda.libs import nvrtc

    m = re.fullmatch(r"sm_([0-9]{2,3})a?", arch)
    if not m:
        raise SpecError(f"malformed architecture '{arch}'; write sm_XX, for example sm_90")
    if int(m.group(1)) < OLDEST_SM:
        raise SpecError(
            f"specgen's kernels need sm_{OLDEST_SM} or later (cp.async, mma.sync in bf16 and "
            f"tf32, rounding to bf16), not {arch}; choose --arch sm_{OLDEST_SM} or sm_90"
        )
    try:
        known = tuple(nvrtc.getSupportedArchs())
    except (AttributeError, RuntimeError):
        return  # an NVRTC too old to say: let it refuse for itself
    if int(m.group(1)) not in known:
        raise SpecError(
            f"NVRTC %d.%d cannot compile for {arch}; it targets " % nvrtc_version()
            + ", ".join(f"sm_{a}" for a in known)
        )


def cache_dir() -> Path:
    env = os.environ.get("SPECGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specgen"


def cache_writable(arch: str) -> bool:
    """Whether compiled entries for ``arch`` can be stored; warns once when not."""
    folder = cache_dir() / arch
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError as e:
        _unwritable(folder, e)
        return False


def _unwritable(folder: Path, e: OSError) -> None:
    warn_once(
        "cache",
        f"the compile cache {folder} cannot be written ({e.strerror or e}); "
        "compiling without caching (set SPECGEN_CACHE_DIR to a writable folder)",
    )


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
    if cubin[:4] != b"\x7fELF":
        raise ValueError("not an ELF cubin")
    try:
        return _elf_objects(cubin)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError, OverflowError) as e:
        # OverflowError: a header whose offsets pass what a range or slice can hold
        raise ValueError(f"malformed cubin: {e}") from None


def _elf_objects(cubin: bytes) -> dict[str, int]:
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    # An ELF64 section header is 64 bytes, and the table lies inside the file.
    if cubin[4] != 2 or shentsize != 64 or shoff + shnum * shentsize > len(cubin):
        raise ValueError("section header table outside the file")
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


def _entry_bytes(meta: dict, cubin: bytes) -> bytes:
    """One cache entry: the SHA-256 of everything after it, then the metadata as one
    JSON line, then the cubin.  Metadata and binary are checked together, so an entry
    that was edited, cut short or mixed from two compilations is compiled again."""
    body = json.dumps(meta, sort_keys=True).encode() + b"\n" + cubin
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _load_cached(path: Path, key: str, arch: str) -> Binary | None:
    """The entry at ``path`` if it checks out, else None (compile again)."""
    try:
        data = path.read_bytes()
        digest, body = data.split(b"\n", 1)
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None
        head, cubin = body.split(b"\n", 1)
        meta = json.loads(head)
        log, defines = meta["log"], meta["defines"]
        if meta["key"] != key or meta["arch"] != arch or not isinstance(log, str):
            return None
        if not isinstance(defines, list) or not all(isinstance(d, str) for d in defines):
            return None
        symbol_sizes(cubin)  # raises ValueError on anything but an ELF cubin
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None  # RecursionError: metadata nested past what json.loads descends
    # The resources are read from ptxas's log again, not trusted from a stored copy.
    return Binary(cubin, arch, parse_resources(log), key, log, tuple(defines))


def _store(path: Path, binary: Binary, name: str) -> None:
    meta = dict(name=name, key=binary.key, arch=binary.arch, log=binary.log)
    meta["defines"] = list(binary.defines)
    try:
        atomic_write(path, _entry_bytes(meta, binary.cubin))
    except OSError as e:
        _unwritable(path.parent, e)


def cached(source: str, arch: str = DEFAULT_ARCH) -> bool:
    """Whether the disk cache holds an entry for ``source`` on ``arch`` (checked when
    it is loaded; a damaged one compiles again then)."""
    return _entry_path(source, arch).exists()


def _entry_path(source: str, arch: str) -> Path:
    return cache_dir() / arch / f"{cache_key(source, arch)}.entry"


def compile_source(source: str, name: str, arch: str = DEFAULT_ARCH, cache: bool = True) -> Binary:
    """Compile (or fetch from the cache) and return the cubin with its resource report.

    When the source offers a second choice of launch bounds (``ALT_BOUNDS``) and the
    first spills, it is compiled again with the second, and where that spills too and
    the source offers a register cap (``REGISTER_CAP``), with the cap; the one with the
    fewest spilled bytes is kept: the cache holds the outcome, so the retries are paid
    once."""
    supported_arch(arch)
    key = cache_key(source, arch)
    path = _entry_path(source, arch)
    if cache and (hit := _load_cached(path, key, arch)):
        return hit
    cubin, log = _nvrtc_compile(source, name, arch)
    binary = Binary(cubin, arch, parse_resources(log), key, log)
    choices = [(ALT_BOUNDS, f"#ifndef {ALT_BOUNDS}"), (REGISTER_CAP, f"#ifdef {REGISTER_CAP}")]
    for define, offered in choices:
        if not binary.spills or offered not in source:
            continue
        cubin, log = _nvrtc_compile(source, name, arch, (define,))
        alt = Binary(cubin, arch, parse_resources(log), key, log, (define,))
        if alt.spills < binary.spills:
            binary = alt
    if cache:
        _store(path, binary, name)
    return binary
