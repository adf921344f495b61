"""The keys docs/metrics.md documents, for tests that check real results against them.

``documented_keys(section)``: the backticked keys in the first column of the table under the
heading whose text is (or else contains) ``section``. ``undocumented(keys, documented)``: the
keys that no documented key matches, where a ``<...>`` placeholder matches any non-empty text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

METRICS_MD = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")
_CODE = re.compile(r"`([^`]+)`")
_PLACEHOLDER = re.compile(r"(<[^<>]+>)")


def _table_rows() -> dict[str, list[str]]:
    """Heading text -> the table rows (lines starting with ``|``) under it."""
    sections: dict[str, list[str]] = {}
    rows: list[str] | None = None
    for line in METRICS_MD.read_text(encoding="utf-8").splitlines():
        heading = _HEADING.match(line)
        if heading:
            rows = sections.setdefault(heading.group(1), [])
        elif rows is not None and line.lstrip().startswith("|"):
            rows.append(line.strip())
    return sections


def documented_keys(section: str) -> set[str]:
    """Keys of the table under the heading ``section`` (else every heading containing it)."""
    sections = _table_rows()
    names = [section] if section in sections else [h for h in sections if section in h]
    if not names:
        raise KeyError(f"no heading of {METRICS_MD} contains {section!r}: {sorted(sections)}")
    return {
        key
        for name in names
        for row in sections[name]
        for key in _CODE.findall(row.strip("|").split("|")[0])
    }


def _pattern(key: str) -> str:
    """A regex for ``key``: the captured ``<...>`` parts (odd indices of the split) match any."""
    parts = _PLACEHOLDER.split(key)
    return "".join(".+" if i % 2 else re.escape(part) for i, part in enumerate(parts))


def undocumented(keys: Iterable[str], documented: Iterable[str]) -> set[str]:
    """The ``keys`` that match none of the ``documented`` keys (``<...>``: any non-empty text)."""
    patterns = [re.compile(_pattern(key)) for key in documented]
    return {str(k) for k in keys if not any(p.fullmatch(str(k)) for p in patterns)}
