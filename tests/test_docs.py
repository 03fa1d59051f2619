"""CPU tier: the repository stays readable: the README and BENCHMARKS.md within the
lengths a reader finishes, scripts/ holding tools only, the project speaking of specgen
and not of the work that made it, and every page the README links to present."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _lines(name: str) -> int:
    return len((REPO / name).read_text().splitlines())


def test_readme_and_benchmarks_stay_short():
    assert _lines("README.md") <= 450
    assert _lines("BENCHMARKS.md") <= 800


def test_scripts_holds_at_most_twenty_tools_each_saying_what_it_does():
    tools = sorted(p for p in (REPO / "scripts").iterdir() if p.is_file())
    assert len(tools) <= 20, [p.name for p in tools]
    for p in tools:
        head = "\n".join(p.read_text().splitlines()[:4])
        assert head.startswith(('"""', "#!")) or head.startswith("#"), p.name
        assert len(head) > 40, f"{p.name} does not say what it does"


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / f for f in out.splitlines() if not f.startswith("docs/measurements/")]


def test_the_project_speaks_of_specgen_alone():
    """No file outside the measurement logs talks about the sittings it was made in."""
    word = re.compile(r"\bsessions?\b", re.IGNORECASE)
    found = []
    for path in _tracked():
        if path.suffix in {".png", ".gz", ".tgz"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [
            f"{path.relative_to(REPO)}:{i}"
            for i, l in enumerate(text.splitlines(), 1)
            if word.search(l)
        ]
    assert not found, found[:20]


def test_the_word_check_finds_the_word():
    """Negative control for the check above."""
    word = re.compile(r"\bsessions?\b", re.IGNORECASE)
    assert word.search("measured in the ninth " + "Sess" + "ion")
    assert not word.search("obsessions")


def test_every_page_the_readme_links_is_there():
    links = re.findall(r"\]\(([^)#]+)\)", (REPO / "README.md").read_text())
    assert links
    missing = [l for l in links if not l.startswith("http") and not (REPO / l).exists()]
    assert not missing, missing
