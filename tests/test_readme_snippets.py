"""Every Python snippet in README.md runs as printed, each in a fresh process with a plain Ray.

A user copies a snippet into a script on a laptop (here: the 2-core CI machine) and runs it;
it must start (no resource ask the machine cannot meet), finish and leave nothing running.
The snippets run two at a time in the background of the whole session, at low CPU priority
(``script_pool``), each in its own folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from script_pool import session_pool

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytestmark = pytest.mark.subprocess


def snippets() -> list[tuple[str, str]]:
    """``(section heading, code)`` of every fenced Python block in the README."""
    text = README.read_text()
    out = []
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL):
        headings = re.findall(r"^#+ (.+)$", text[: match.start()], flags=re.MULTILINE)
        out.append((headings[-1] if headings else "top", match.group(1)))
    return out


SNIPPETS = snippets()


def test_the_readme_has_the_snippets_these_tests_run():
    headings = [heading for heading, _ in SNIPPETS]
    assert len(SNIPPETS) >= 5, headings
    assert len(set(headings)) == len(headings), "one snippet per section: runs are keyed by it"
    assert any("GorilaDQN" in h for h in headings) and any("V-trace" in h for h in headings)


IDS = [heading for heading, _ in SNIPPETS]


def script_runs(pool, selected: list[str], mktemp) -> None:
    """Queue each selected snippet as ``snippet.py`` in a folder of its own (``script_pool``:
    at the session's first test that may start processes)."""
    for heading, code in SNIPPETS:
        if f"test_readme_snippet_runs_as_printed[{heading}]" in selected:
            folder = mktemp("snippet")
            (folder / "snippet.py").write_text(code + "\nimport ray\nray.shutdown()\n")
            pool.submit(heading, [folder / "snippet.py"], timeout=280, out_dir=folder, cwd=folder)


@pytest.fixture
def snippet_runs(request):
    return session_pool(request)


@pytest.mark.parametrize("heading", IDS, ids=IDS)
def test_readme_snippet_runs_as_printed(heading, snippet_runs):
    snippet_runs.output(heading)
