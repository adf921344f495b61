"""Every Python snippet in README.md runs as printed, each in a fresh process with a plain Ray.

A user copies a snippet into a script on a laptop (here: the 2-core CI machine) and runs it;
it must start (no resource ask the machine cannot meet), finish and leave nothing running.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytestmark = pytest.mark.slow


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
    assert any("GorilaDQN" in h for h in headings) and any("V-trace" in h for h in headings)


@pytest.mark.parametrize(
    "code", [code for _, code in SNIPPETS], ids=[heading for heading, _ in SNIPPETS]
)
def test_readme_snippet_runs_as_printed(code, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(code + "\nimport ray\nray.shutdown()\n")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"snippet failed:\n{code}\n---\n{proc.stdout}\n{proc.stderr}"
