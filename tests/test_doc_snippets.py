"""Every Python code block of README.md and of the documentation pages (``docs/``) runs as
printed, each in a fresh process with a plain Ray.

A user copies a block into a script on a laptop (here: the 2-core CI machine) and runs it; it
must start (no resource ask the machine cannot meet), finish and leave nothing running. Blocks
that are the same code (the README's quickstarts repeat the getting-started page's) run once.
The runs go two at a time in the background of the whole session, at low CPU priority
(``script_pool``), each in its own folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from script_pool import session_pool

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

pytestmark = pytest.mark.subprocess


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """``(section heading, code)`` of every fenced Python block of one Markdown page."""
    text = page.read_text()
    out = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        headings = re.findall(r"^#+ (.+)$", text[: match.start()], flags=re.MULTILINE)
        out.append((headings[-1] if headings else "top", match.group(1)))
    return out


def snippets() -> dict[str, str]:
    """Run id (``page: heading``, of the block's first appearance) -> code, one per distinct
    block."""
    runs: dict[str, str] = {}
    for page in PAGES:
        for heading, code in code_blocks(page):
            if code in runs.values():
                continue
            run_id = f"{page.relative_to(ROOT)}: {heading}"
            assert run_id not in runs, f"two different code blocks under {run_id!r}"
            runs[run_id] = code
    return runs


SNIPPETS = snippets()


def test_the_pages_have_the_snippets_these_tests_run():
    ids = list(SNIPPETS)
    assert len(ids) >= 8, ids
    assert any(i.startswith("README.md") for i in ids), ids
    for page in ("rllib", "tianshou", "seed-vtrace", "checkpoints"):
        assert any(i.startswith(f"docs/{page}.md") for i in ids), (page, ids)


def test_code_blocks_are_read_with_their_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n\n```python\nx = 1\n```\n\n```python\nx = 2\n```\n")
    blocks = code_blocks(page)
    assert [heading for heading, _ in blocks] == ["A", "A"]
    assert [code for _, code in blocks] == ["x = 1\n", "x = 2\n"]


def script_runs(pool, selected: list[str], mktemp) -> None:
    """Queue each selected block as ``snippet.py`` in a folder of its own (``script_pool``:
    before the session's first test)."""
    for run_id, code in SNIPPETS.items():
        if f"test_doc_snippet_runs_as_printed[{run_id}]" in selected:
            folder = mktemp("snippet")
            (folder / "snippet.py").write_text(code + "\nimport ray\nray.shutdown()\n")
            pool.submit(run_id, [folder / "snippet.py"], timeout=280, out_dir=folder, cwd=folder)


@pytest.fixture
def snippet_runs(request):
    return session_pool(request)


@pytest.mark.parametrize("run_id", list(SNIPPETS), ids=list(SNIPPETS))
def test_doc_snippet_runs_as_printed(run_id, snippet_runs):
    snippet_runs.output(run_id)
