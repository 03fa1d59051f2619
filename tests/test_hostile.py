"""CPU tier: specgen used as a hostile user would.  Every refusal is one line on stderr
with exit status 2 and names what to do instead; no result is lost or half-written."""

import json
import os
import stat
import time

import pytest
from click.testing import CliRunner

from specgen import tunedb
from specgen.cli import main
from specgen.shapes import PRESETS

LAYER2_T16 = "tiled_t16_x4y1m8_planar_wconst_lc_fp32.cu"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r, needle: str) -> str:
    """The call ended with exit 2 and one line on stderr holding ``needle``."""
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args,needle",
    [
        # 1. parsable but impossible values
        (["--strategy", "split", "--splits", "0"], "'--splits': 0 is not in the range 1<="),
        (["--strategy", "split", "--splits", "-3"], "'--splits': -3 is not in the range"),
        (["--strategy", "split", "--splits", "3"], "split s3 must divide C=4"),
        (["--strategy", "direct", "--splits", "2"], "--splits does not apply to direct"),
        (["--tile", "-1"], "'--tile': -1 is not in the range"),
        (["--strategy", "stream", "--maps", "0"], "'--maps': 0 is not in the range"),
        (["--tile", "9" * 5000], "'--tile'"),
        # 9. huge numbers are refused in arithmetic, not by a scan
        (["--tile", "1000000000001"], "'--tile': 1000000000001 is not in the range"),
        (["--tile", "2147483647"], "tile 2147483647 is larger than the 34x34 output needs"),
        (["--strategy", "persist", "--tile", "2147483647"], "1 to Ho=34"),
        (["--strategy", "implicit", "--tile", "2147483647"], "must divide the tile of"),
        (["--strategy", "implicit", "--tile", "2147483648"], "is not in the range"),
        (["--strategy", "implicit", "--tile", "4194304"], "over the limit of 1024 threads"),
        (["--coarsening", "x999999999y1m1"], "must divide the tile"),
        # 11. an option the strategy does not read is refused, naming who reads it
        (["--strategy", "tiled", "--regtile", "4x4"], "--regtile does not apply to tiled"),
        (["--strategy", "direct", "--layout", "planar"], "it is read by tiled, split"),
        (["--strategy", "persist", "--coarsening", "x4y1m4"], "--coarsening does not apply"),
        (["--variant", "persist_t12_r4x17_fp32", "--tile", "8"], "--variant names a whole"),
        (["--best", "--tile", "8"], "--best emits the tuned winners; drop --tile"),
        (["--all", "--tile", "8"], "--all is the shape's default variant set"),
        (["--gpu", "NVIDIA H200", "--tile", "8"], "drop it or the variant options"),
        # 12. messages
        (["--regtile", "0x4", "--strategy", "implicit"], "malformed register tile '0x4'"),
        (["--coarsening", "x0y1m1"], "malformed coarsening 'x0y1m1'"),
        (["--variant", ""], "malformed variant name ''"),
        (["--bogus"], "No such option '--bogus'"),
        (["--tile", "abc"], "'abc' is not a valid integer"),
        (["--strategy", "tiled\nfake second line"], "unknown strategy 'tiled\\nfake"),
    ],
)
def test_refusals_on_layer2(args, needle, tmp_path):
    started = time.monotonic()
    refused(run("emit", "--shape", "layer2", "--out", tmp_path, *args), needle)
    assert time.monotonic() - started < 10
    assert not list(tmp_path.rglob("*")), "nothing is written on bad input"


@pytest.mark.parametrize(
    "spec,extra,needle",
    [
        ("C=1,M=65537,H=8,W=8,K=3", ["--strategy", "direct", "--weights", "global"], "grid y"),
        ("C=1,M=2000000,H=8,W=8,K=3", ["--strategy", "direct"], "over the limit of 65535"),
        ("C=1,M=1,H=100000,W=100000,K=3", [], "one image of x holds C*H*W = 10000000000"),
        ("C=1,M=1000000000000,H=8,W=8,K=3", [], "M=1000000000000 is over 2147483647"),
        ("C=1,M=2000000000,H=8,W=8,K=3", [], "one image of y holds"),
        ("C=4,M=16,H=40,W=40,K=7,pad=٣", [], "malformed shape spec"),
        ("C=4,M=16,H=40,W=40,K=7\n", [], None),  # trailing whitespace is fine
        ("", [], "unknown shape ''"),
        ("layer2\u2028x", [], "unknown shape 'layer2\\u2028x'"),
    ],
)
def test_refusals_of_shapes(spec, extra, needle, tmp_path):
    started = time.monotonic()
    r = run("emit", "--shape", spec, "--out", tmp_path, *extra)
    assert time.monotonic() - started < 10
    if needle is None:
        assert r.exit_code == 0, r.output
    else:
        refused(r, needle)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["verify", "--shape", "ae-enc2", "--strategy", "persist"], "persist"),
        (["verify", "--all"], "give --shape S or --all-shapes"),
        (["verify", "--shape", "layer2", "--all-shapes"], "give --shape S or --all-shapes"),
        (["verify", "--shape", "layer2", "--strategy", "split", "--splits", "0"], "'--splits'"),
        (["verify", "--shape", "layer2", "--arch", "sm_10"], "need sm_80 or later"),
        (["verify", "--shape", "layer2", "--arch", "90"], "malformed architecture '90'"),
        (["verify", "--shape", "layer2", "--jobs", "0"], "'--jobs': 0 is not in the range"),
        (["bench", "--shape", "layer2", "--best", "--all"], "choose one of"),
        (["bench", "--shape", "layer2", "--json", "."], "--json . is a folder"),
        (["tune", "--shape", "layer2", "--budget", "0"], "'--budget': 0 is not in the range"),
        (["tune"], "give one of --shape, --problems and --model"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_refusals_of_other_verbs(args, needle):
    refused(run(*args), needle)


def test_every_option_has_help():
    """Options carry their own help; an argument (click gives it none) is named in its
    command's help text."""
    import click

    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Argument):
                assert param.name.upper() in (command.help or ""), f"{name} {param.name}"
            elif param.name not in ("help", "version"):
                assert getattr(param, "help", None), f"{name} {param.name}"


# 2. output paths that cannot be used are refused, not crashed on


def test_out_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    refused(run("emit", "--shape", "layer2", "--out", blocker / "sub"), "cannot write")
    refused(run("emit", "--shape", "layer2", "--out", blocker), "cannot write")
    refused(run("emit", "--shape", "layer2", "--out", "/dev/null"), "cannot write")


def test_out_file_that_is_a_folder(tmp_path):
    (tmp_path / "layer2" / LAYER2_T16).mkdir(parents=True)
    refused(run("emit", "--shape", "layer2", "--tile", 16, "--out", tmp_path), "cannot write")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_read_only(tmp_path):
    tmp_path.chmod(0o555)
    try:
        refused(run("emit", "--shape", "layer2", "--out", tmp_path / "x"), "cannot write")
    finally:
        tmp_path.chmod(0o755)


def test_existing_file_that_is_not_utf8_is_replaced(tmp_path):
    target = tmp_path / "layer2" / LAYER2_T16
    target.parent.mkdir()
    target.write_bytes(b"\xff\xfe not utf-8")
    r = run("emit", "--shape", "layer2", "--tile", 16, "--out", tmp_path)
    assert r.exit_code == 0 and r.output.startswith("wrote"), r.output
    assert target.read_text().startswith("//")


# 3. and 14. modes follow the umask; temporaries of a killed run are removed


def test_written_files_follow_the_umask_and_keep_their_mode(tmp_path):
    old = os.umask(0o027)
    try:
        r = run("emit", "--shape", "layer2", "--tile", 16, "--out", tmp_path)
        assert r.exit_code == 0
        target = tmp_path / "layer2" / LAYER2_T16
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
        target.chmod(0o644)
        target.write_text("stale")
        assert run("emit", "--shape", "layer2", "--tile", 16, "--out", tmp_path).exit_code == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o644, "a rewrite keeps the file's mode"
    finally:
        os.umask(old)


def test_stale_temporaries_are_removed(tmp_path):
    folder = tmp_path / "layer2"
    folder.mkdir()
    stale = folder / f".{LAYER2_T16}.abc123.tmp"
    fresh = folder / f".{LAYER2_T16}.def456.tmp"  # another process writing right now
    for p in (stale, fresh):
        p.write_text("half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert run("emit", "--shape", "layer2", "--tile", 16, "--out", tmp_path).exit_code == 0
    assert not stale.exists() and fresh.exists()


# 5.-8. the results database


def _winner(shape="layer2", gpu="GPU A", variant="persist_t12_r4x17_fp32", **kw):
    rec = dict(
        kind="winner",
        shape=PRESETS[shape].spec,
        slug=shape,
        batch=10000,
        precision="fp32",
        variant=variant,
        ms=1.79,
        gpu=gpu,
        date="2026-11-22",
        tie=False,
        runner_up=None,
    )
    rec.update(kw)
    return rec


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tunedb, "warn_once", _Warnings())
    path = tunedb.db_path()
    path.parent.mkdir(parents=True)
    return path


class _Warnings(list):
    def __call__(self, key, message):
        self.append(message)


def test_reader_skips_every_kind_of_bad_line_with_one_warning(db):
    good = _winner()
    bad = [
        b"\xff\xfe\n",
        b"[1, 2, 3]\n",
        b'"a string"\n',
        json.dumps({k: v for k, v in _winner().items() if k != "variant"}).encode() + b"\n",
        json.dumps(_winner(ms=None)).encode() + b"\n",
        json.dumps(_winner(ms="fast")).encode() + b"\n",
        json.dumps(_winner(ms=float("nan"))).encode() + b"\n",
        json.dumps(_winner(ms=True)).encode() + b"\n",
        json.dumps(_winner(precision="fp64")).encode() + b"\n",
        json.dumps(_winner(batch=0)).encode() + b"\n",
        b'{"kind": "winner", "shape": ',
    ]
    db.write_bytes(json.dumps(good).encode() + b"\n\n" + b"".join(bad))
    found = tunedb.winners(PRESETS["layer2"].spec, "GPU A")
    assert found["fp32"]["variant"] == good["variant"] and found["fp32"]["line"] == 1
    warnings = tunedb.warn_once
    assert len(warnings) == 1 and f"skipped {len(bad)} unreadable line(s)" in warnings[0]


def test_an_append_after_a_cut_short_record_starts_a_new_line(db):
    db.write_bytes(json.dumps(_winner()).encode()[:-7])  # killed mid-write
    tunedb.append(_winner(gpu="GPU B"))
    assert [r["gpu"] for r in tunedb.records()] == ["GPU B"]
    tunedb.append(_winner(gpu="GPU C"))
    assert [r["gpu"] for r in tunedb.records()] == ["GPU B", "GPU C"]


def test_unwritable_database_warns_and_loses_only_the_save(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(blocker))
    monkeypatch.setattr(tunedb, "warn_once", _Warnings())
    tunedb.append(_winner())
    assert tunedb.records() == [] and "cannot append" in tunedb.warn_once[0]


def test_best_uses_only_the_named_gpu(db, tmp_path):
    db.write_text(
        json.dumps(_winner(gpu="GPU A", variant="persist_t12_r4x17_fp32"))
        + "\n"
        + json.dumps(_winner(gpu="GPU B", variant="persist_t34_r8x4_fp32", ms=1.5))
        + "\n"
        + json.dumps(_winner(gpu="GPU B", precision="tf32", variant="mmapersist_t34_r16x48_tf32"))
        + "\n"
    )
    out = tmp_path / "out"
    r = run("emit", "--shape", "layer2", "--best", "--gpu", "GPU A", "--out", out)
    assert r.exit_code == 0, r.output
    assert [p.name for p in out.rglob("*.cu")] == ["persist_t12_r4x17_fp32.cu"]
    assert "on GPU A" in (out / "layer2" / "persist_t12_r4x17_fp32.cu").read_text()
    refused(run("emit", "--shape", "layer2", "--best", "--gpu", "GPU C"), "no tuned winner")


def test_best_without_a_gpu_asks_for_one(db):
    from specgen.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    refused(run("emit", "--shape", "layer2", "--best"), "name it with --gpu")


def test_best_shipped_winners_match_generated(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    r = run("emit", "--shape", "layer2", "--best", "--gpu", "NVIDIA H200", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    generated = Path(__file__).resolve().parent.parent / "generated"
    written = list((tmp_path / "layer2").glob("*.cu"))
    assert written, "emit --best wrote nothing"
    for f in written:
        assert f.read_text() == (generated / "layer2" / f.name).read_text()


def test_best_is_all_or_nothing_and_names_the_line(db, tmp_path):
    db.write_text(
        json.dumps(_winner(variant="persist_t12_r4x17_fp32"))
        + "\n"
        + json.dumps(_winner(precision="tf32", variant="mmapersist_t99_r16x48_tf32"))
        + "\n"
    )
    out = tmp_path / "out"
    message = refused(
        run("emit", "--shape", "layer2", "--best", "--gpu", "GPU A", "--out", out),
        "line 2: the recorded winner 'mmapersist_t99_r16x48_tf32' cannot be planned",
    )
    assert str(db) in message
    assert not out.exists(), "nothing is written when one winner cannot be planned"
