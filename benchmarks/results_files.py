"""Writing a benchmark's results: ``<stem>.json`` (the report) and ``<stem>.md`` (its table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(stem: Path, report: dict[str, Any], markdown_lines: list[str]) -> None:
    """Write ``stem.json`` and ``stem.md`` (creating the folder) and print the markdown."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = "\n".join(markdown_lines).rstrip("\n") + "\n"
    stem.with_suffix(".md").write_text(text)
    print(text)
