"""The tuning results database: one JSON object per line, appended, never rewritten.

A line that cannot be read (cut short by a killed run, not UTF-8, not an object, a
record missing a field or holding a value of the wrong type) is skipped and counted
in one warning; it never stops a reader.  An append always starts on a line of its
own, so a record cut short by a crash cannot swallow the next one.  Every reader asks
for one GPU: a result measured on another GPU is never used.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
from pathlib import Path

from .compile import cache_dir
from .errors import SpecError, warn_once
from .files import atomic_write
from .variants import Precision

SHIPPED = Path(__file__).with_name("winners.json")
# The winners of whole-model tunes, per GPU and layer problem (``ship_layer_winners``)
LAYER_WINNERS = Path(__file__).with_name("layer_winners.json")

# What each kind of record must hold, and the type of each field.
_POSITIVE = "positive number"
_COUNT = "count"
# One candidate's key, in every record of a candidate: the compiler, the problem (its
# spec), the batch, the variant and the hash of its rendered source.
_CANDIDATE = dict(nvrtc=str, shape=str, batch=_COUNT, variant=str, source=str)
REQUIRED = {
    "timing": dict(_CANDIDATE, gpu=str, driver=int, ms=_POSITIVE),
    "compiled": dict(_CANDIDATE, arch=str, status=str),  # a many-problem tune's compile
    "dropped": dict(_CANDIDATE, gpu=str, status=str),  # its GPU phase's, not timed: why
    "winner": dict(
        gpu=str,
        shape=str,
        batch=_COUNT,
        precision=str,
        variant=str,
        ms=_POSITIVE,
        date=str,
    ),
}


def db_path() -> Path:
    return cache_dir() / "tune.jsonl"


def _is(value, kind) -> bool:
    if kind == _POSITIVE:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok and math.isfinite(value) and value > 0
    if kind == _COUNT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return isinstance(value, kind) and not isinstance(value, bool)


def valid(record) -> bool:
    """A record every reader can use without checking it again."""
    if not isinstance(record, dict) or record.get("kind") not in REQUIRED:
        return False
    if not all(_is(record.get(k), t) for k, t in REQUIRED[record["kind"]].items()):
        return False
    if record["kind"] == "winner":
        if record["precision"] not in {p.value for p in Precision}:
            return False
        if not isinstance(record.get("tie", False), bool):
            return False
        if not isinstance(record.get("runner_up"), (str, type(None))):
            return False
    return True


# What ``records`` read of each file: the file's identity, how far it read (whole lines
# only), the last bytes before there (a file rewritten in place is read again), the
# records and the unreadable lines' numbers.  The database only grows between reads
# (``append``), and planning a model's 200 searches asked for it hundreds of times:
# with resnet50's 6 MB after a budget-40 tune that was 37-49 s of the tune's setup
# (2 H200s, 2026-11-28).
_READ: dict[str, dict] = {}
_TAIL = 64


def records(path: Path | None = None) -> list[dict]:
    """Every readable record of this machine's database (or of the one at ``path``),
    each with ``line``: its line number in the file.  Only what was appended since the
    last call is parsed; the records are shared between calls, to be read, not changed."""
    path = path or db_path()
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            seen = _READ.get(str(path))
            start = seen["offset"] if seen else 0
            fresh = (
                seen is None
                or seen["id"] != (st.st_dev, st.st_ino)
                or st.st_size < start
                or (start and _tail(f, start) != seen["tail"])
            )
            if fresh:
                seen = dict(id=(st.st_dev, st.st_ino), offset=0, lines=0, out=[], bad=[], tail=b"")
            f.seek(seen["offset"])
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1  # whole lines are kept; a line still being written is not
    for raw in data[:end].split(b"\n")[:-1]:
        seen["lines"] += 1
        _parse(raw, seen["lines"], seen["out"], seen["bad"])
    seen["offset"] += end
    seen["tail"] = (seen["tail"] + data[:end])[-_TAIL:]
    _READ[str(path)] = seen
    out, bad = list(seen["out"]), list(seen["bad"])
    _parse(data[end:], seen["lines"] + 1, out, bad)  # the last line, without its newline
    if bad:
        lines = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        warn_once(
            f"db:{path}",
            f"skipped {len(bad)} unreadable line(s) of {path} (line {lines}); "
            "the other records are used",
        )
    return out


def _tail(f, offset: int) -> bytes:
    """The ``_TAIL`` bytes of the open file ``f`` before ``offset``."""
    f.seek(max(0, offset - _TAIL))
    return f.read(min(offset, _TAIL))


def _parse(raw: bytes, number: int, out: list, bad: list) -> None:
    """Line ``number`` of a database: a record onto ``out``, else its number onto
    ``bad``; a blank line is neither."""
    if not raw.strip():
        return
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # undecodable, malformed, or nested too deep
        record = None
    if valid(record):
        out.append(dict(record, line=number))
    else:
        bad.append(number)


def append(record: dict) -> None:
    """Add one record on a line of its own.  A database that cannot be written costs
    this run's records (said once), not the run: the results are printed anyway."""
    path = db_path()
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # the last record was cut short
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as e:
        warn_once(
            f"db-write:{path}",
            f"cannot append to {path} ({e.strerror or e}); this run's results are printed "
            "but not saved",
        )


MEASURED_ON = ("gpu", "driver", "nvrtc")  # what a timing holds for only


def candidate_key(r: dict) -> tuple:
    """A compile or timing record's candidate: problem, batch, variant and the hash of its
    rendered source (``dist.Item.key``)."""
    return tuple(r.get(k) for k in ("shape", "batch", "variant", "source"))


def measured_on(r: dict, env: dict) -> bool:
    """Whether a timing record was measured on ``env``'s GPU, driver and compiler."""
    return all(r.get(k) == env.get(k) for k in MEASURED_ON)


def import_timings(path: Path) -> tuple[int, int]:
    """Another results database's timings (``path``, gzipped where it ends in .gz) added
    to this machine's, those it holds already left out: a many-problem tune then times
    only what they lack (a candidate new to the sample, a source changed since) and each
    problem's finalists again.  Its compile and winner records stay behind, so that the
    tune compiles every candidate here and picks each winner anew.  Returns (added, held
    already); SpecError where the file cannot be read or holds no timing."""
    import gzip
    import zlib

    opener = gzip.open if path.suffix == ".gz" else open
    found, bad = [], []
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                _parse(raw, number, found, bad)
    except (OSError, EOFError, zlib.error) as e:  # a bad gzip header is an OSError
        raise SpecError(f"cannot read timings from {path}: {getattr(e, 'strerror', None) or e}")
    timings = [r for r in found if r["kind"] == "timing" and r.get("status", "ok") == "ok"]
    if not timings:
        raise SpecError(f"{path} holds no timing records to take")

    def key(r):
        return (tuple(r.get(k) for k in MEASURED_ON), candidate_key(r))

    held = {key(r) for r in records() if r["kind"] == "timing"}
    added = 0
    for r in timings:
        if key(r) not in held:
            held.add(key(r))
            append({k: v for k, v in r.items() if k != "line"})
            added += 1
    return added, len(timings) - added


@contextlib.contextmanager
def locked(key: str):
    """Hold an exclusive lock named by ``key`` (a problem's spec) across processes, so
    that several processes that meet the same new problem tune it once: the first tunes,
    the rest wait, then find its winner.  Where the cache cannot hold a lock file the
    work goes on unlocked (a second tuning costs time, never a result)."""
    import fcntl

    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = db_path().parent / "locks" / f"{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        warn_once(f"lock:{path}", f"cannot create {path} ({e.strerror or e}); tuning unlocked")
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def timings(env: dict, shape_spec: str, batch: int) -> dict[tuple[str, str], dict]:
    """(variant, source hash) -> timing record, for this GPU, driver and NVRTC only."""
    return {
        (r["variant"], r["source"]): r
        for r in records()
        if r["kind"] == "timing"
        and measured_on(r, env)
        and r["shape"] == shape_spec
        and r["batch"] == batch
    }


def winners(shape_spec: str, gpu: str, batch: int | None = None) -> dict[str, dict]:
    """The latest winner per precision for the shape, measured on ``gpu``; where a
    precision was tuned at several batches, the latest at the batch nearest ``batch``
    (as ``layer_winners`` takes them; no batch: the latest of all)."""
    latest = {}
    for r in records():
        if r["kind"] == "winner" and r["shape"] == shape_spec and r["gpu"] == gpu:
            latest[(r["precision"], r["batch"] if batch else None)] = r
    out = {}
    for (precision, _), r in latest.items():
        kept = out.get(precision)
        if kept is None or _batch_distance(r["batch"], batch) < _batch_distance(
            kept["batch"], batch
        ):
            out[precision] = r
    return out


def recorded_gpus() -> list[str]:
    return sorted({r["gpu"] for r in records() if r["kind"] == "winner"})


def shipped() -> dict[str, dict[str, list[str]]]:
    """GPU -> preset -> variant names: the winners shipped with specgen (data, so that
    the default set, bench and tune need not import each other)."""
    return json.loads(SHIPPED.read_text())["winners"]


def shipped_ms(slug: str, gpu: str) -> dict[str, float]:
    """Kernel name -> the median measured for it at the preset's default batch."""
    return json.loads(SHIPPED.read_text()).get("ms", {}).get(gpu, {}).get(slug, {})


@functools.cache
def _layer_winners() -> dict:
    return json.loads(LAYER_WINNERS.read_text())["winners"]


def layer_winners(spec: str, gpu: str, batch: int | None = None) -> dict[str, dict]:
    """Precision -> the winner a whole-model tune on ``gpu`` found for the layer problem
    ``spec`` and specgen ships (its variant, ms and cuDNN's ms at its batch).  A math
    tuned at several batches keeps a winner for each (the slices of a wgrad, the tile of
    a small map, follow the batch): the one at the batch nearest ``batch`` (by ratio; a
    tie to the larger), or at the largest where no batch is given."""
    return {
        math: min(rs, key=lambda r: _batch_distance(r["batch"], batch))
        for math, rs in _layer_winners().get(gpu, {}).get(spec, {}).items()
    }


def _batch_distance(tuned: int, batch: int | None) -> tuple[float, int]:
    """How far a winner tuned at batch ``tuned`` is from a call at ``batch``, smallest
    first: their ratio, the larger batch first on a tie (no batch: the largest first)."""
    if batch is None:
        return (0.0, -tuned)
    return (max(tuned, batch) / min(tuned, batch), -tuned)


def ship_layer_winners(
    db: Path, gpu: str, tune: dict, path: Path = LAYER_WINNERS, keep_faster: bool = False
) -> int:
    """Every winner the results database at ``db`` holds for ``gpu`` put into the shipped
    layer winners at ``path`` (``layer_winners.json``): each replaces the one shipped
    before for its problem, math and batch, and stands beside those of other batches;
    ``tune`` (what was tuned, the command, its log and tree) is added to its list of
    tunes.  ``keep_faster``: a shipped winner stays where it ran faster than the new
    one (a tune of a smaller budget may not have drawn it): where the tune timed it too,
    their times in that run; else their times over cuDNN's in their own runs.  The file
    is written whole; returns the winners shipped."""
    every = records(db)
    found = [r for r in every if r["kind"] == "winner" and r["gpu"] == gpu]
    timed = {  # the tune's first-pass time of each candidate of a problem and batch
        (r["shape"], r["batch"], r["variant"]): r["ms"]
        for r in every
        if r["kind"] == "timing" and r["gpu"] == gpu and r.get("status", "ok") == "ok"
    }
    if not found:
        raise SpecError(f"{db} holds no winner measured on {gpu}")
    shipped = json.loads(path.read_text())
    table = shipped["winners"].setdefault(gpu, {})
    taken = 0
    for r in found:  # in the database's order: a later winner of the same batch replaces
        at = table.setdefault(r["shape"], {}).setdefault(r["precision"], [])
        entry = {
            "variant": r["variant"],
            "ms": round(r["ms"], 4),
            "cudnn_ms": round(r["cudnn_ms"], 4) if r.get("cudnn_ms") else None,
            "batch": r["batch"],
            "date": r["date"],
        }
        before = [old for old in at if old["batch"] == r["batch"]]
        if keep_faster and before:
            # the old winner's time in this tune: among the finalists timed again at
            # the end, else in the first pass
            name = before[0]["variant"]
            again = r.get("finalists", {}).get(name)
            again = again or timed.get((r["shape"], r["batch"], name))
            if not _faster(r, before[0], again):
                continue
        at[:] = [old for old in at if old["batch"] != r["batch"]]
        at.append(entry)
        at.sort(key=lambda w: w["batch"])
        taken += 1
    shipped["winners"][gpu] = dict(sorted(table.items()))
    shipped["tunes"].append(dict(tune, gpu=gpu, winners=taken))
    atomic_write(path, (json.dumps(shipped, indent=1) + "\n").encode())
    _layer_winners.cache_clear()
    return taken


def _faster(new: dict, old: dict, old_ms: float | None = None) -> bool:
    """Whether winner ``new`` (a database record) ran faster than ``old`` (a shipped
    one): where the new one's tune timed the old one too (``old_ms``), their times in
    that run; else their times over cuDNN's in their own runs where both have cuDNN's,
    else their times.  Across runs cuDNN's own time moves: mobilenet_v2's dgrad of 144
    channels into 24 took 0.0363 ms in one tune and 0.0308 in the next (H200), which
    made a kernel 11% slower in the second run look the faster by its ratio."""
    if old_ms is not None:
        return new["ms"] < old_ms
    if new.get("cudnn_ms") and old.get("cudnn_ms"):
        return new["ms"] / new["cudnn_ms"] < old["ms"] / old["cudnn_ms"]
    return new["ms"] < old["ms"]


def shipped_names(slug: str, gpu: str | None = None) -> list[str]:
    """The names shipped for a preset on ``gpu``, or on every GPU when none is named."""
    tables = [shipped().get(gpu, {})] if gpu is not None else shipped().values()
    return [name for table in tables for name in table.get(slug, [])]
