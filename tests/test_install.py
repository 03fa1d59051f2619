"""CPU tier: a regular (not editable) install works from any folder.

The wheel is built from this tree and installed into a fresh virtualenv; that
environment borrows this one's dependencies (jinja2, click, numpy, CuPy, NVRTC) through
a .pth file, so nothing is downloaded, while specgen itself comes only from the wheel.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILE = "layer2/tiled_t16_x4y1m8_planar_wconst_lc_fp32.cu"


def _nvrtc_env() -> dict:
    """CuPy looks for the NVRTC wheel's library in its own environment's site-packages;
    borrowed through a .pth it is not there, so the loader is told where it is."""
    import importlib.util

    env = dict(os.environ)
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    for folder in spec.submodule_search_locations if spec else ():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(Path(folder) / "lib"), env.get("LD_LIBRARY_PATH")])
        )
    return env


def _run(*args, cwd=None):
    r = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=_nvrtc_env()
    )
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_wheel_installs_and_works_outside_the_tree(tmp_path):
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", dist, REPO)
    (wheel,) = dist.glob("specgen-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python, specgen = venv / "bin" / "python", venv / "bin" / "specgen"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (Path(purelib.strip()) / "specgen_test_deps.pth").write_text("\n".join(deps) + "\n")
    _run(python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps", wheel)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(python, "-c", "import specgen; print(specgen.__file__)", cwd=elsewhere)
    assert where.startswith(str(venv)), where

    _run(specgen, "emit", "--shape", "layer2", "--tile", "16", "--out", "OUT", cwd=elsewhere)
    assert (elsewhere / "OUT" / FILE).read_text() == (REPO / "generated" / FILE).read_text()
    _run(specgen, "emit", "--shape", "layer2", "--tile", "16", cwd=elsewhere)
    assert (elsewhere / "generated" / FILE).is_file(), "generated/ defaults to the current folder"

    out = _run(specgen, "verify", "--shape", "layer2", "--tile", "16", "--jobs", "1", cwd=elsewhere)
    assert "COMPILED" in out or "PASS" in out
    assert "0 failed" in out

    # Every template folder ships: the backward ops' templates too.
    _run(
        specgen, "emit", "--shape", "layer2", "--op", "all", "--all", "--out", "ALL", cwd=elsewhere
    )
    for f in (elsewhere / "ALL" / "layer2").iterdir():
        assert f.read_text() == (REPO / "generated" / "layer2" / f.name).read_text(), f.name
    # The operator's own template (its weight gather) ships, renderable without PyTorch.
    _run(
        python,
        "-c",
        "from specgen.runtime import gather_source; assert 'gather_bf16_fp32' in gather_source('bf16', 'fp32')[1]",
        cwd=elsewhere,
    )
    # The layer winners ship: a resnet50 layer's pick on the H200 is its tuned winner.
    spec = "C=64,M=64,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc"
    _run(specgen, "emit", "--shape", spec, "--gpu", "NVIDIA H200", "--out", "L", cwd=elsewhere)
    (emitted,) = (elsewhere / "L").glob("*/*.cu")
    assert "shipped winner of a whole-model tune" in emitted.read_text()
    # The PyTorch operator's package ships (importing it needs PyTorch, an extra).
    _run(
        python,
        "-c",
        "import importlib.util as u; assert u.find_spec('specgen.torch')",
        cwd=elsewhere,
    )


def test_every_template_folder_is_a_package_that_ships():
    """A template folder missing from pyproject's packages is left out of an install
    (templates/torch was, for a commit)."""
    import tomllib

    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    folders = {d.name for d in (REPO / "templates").iterdir() if d.is_dir() and any(d.glob("*.j2"))}
    assert {f"specgen.templates.{f}" for f in folders} <= set(packages)
