"""The documentation: the site builds strict, the generated configuration reference matches the
code, the README stays short and self-contained, and every page it names exists.

(The code blocks of the README and the pages run in ``test_doc_snippets.py``.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

sys.path.insert(0, str(DOCS))
import gen_configuration  # noqa: E402  (docs/gen_configuration.py)


def test_the_configuration_reference_is_what_the_code_says():
    assert (DOCS / "configuration.md").read_text() == gen_configuration.render(), (
        "docs/configuration.md is out of date: run python docs/gen_configuration.py"
    )


def test_a_setting_without_a_description_is_refused_by_name():
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Settings:
        """Settings.

        Attributes:
            described: has a line.
        """

        described: int = 1
        silent: int = 2

    with pytest.raises(ValueError, match=r"Settings: no description for \['silent'\]"):
        gen_configuration.table(gen_configuration.dataclass_rows(Settings), where="Settings")


def test_docstring_markup_becomes_markdown():
    text = "a :class:`~rl_dist_ext.replay.ObsCompression`, ``None`` or :func:`f`"
    assert gen_configuration.markdown(text) == "a `ObsCompression`, `None` or `f`"


def links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)


def test_the_readme_is_short_and_names_only_what_the_repository_holds():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for target in links(text):
        if target.startswith(("http://", "https://")):
            pytest.fail(f"the README links outside the repository: {target}")
        assert (ROOT / target).exists(), f"the README links to {target}, which is not here"
    assert "../" not in text and "ARCHITECTURE" not in text and "STYLE.md" not in text


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s*([\w/-]+\.md)\s*$", nav, flags=re.MULTILINE))
    assert pages == listed


@pytest.mark.subprocess
def test_the_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link, anchor, reference or docstring fails it."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "index.html").exists()
    api = (tmp_path / "api" / "index.html").read_text()
    assert "DistributedReplayConfig" in api and "GorilaDQNConfig" in api
