"""Fixed long texts for the gates that need natural language rather than a needle haystack.

The source is the pinned upstream tree's own documentation (README.md, then docs/**/*.md in
sorted order): always present after `llama-sparse vendor`, identical on every machine, and
varied enough that attention is not trivially local.
"""

from __future__ import annotations

from typing import Callable

from llama_sparse.errors import UserError
from llama_sparse.project import Project


def reference_text(project: Project | None = None) -> str:
    root = (project or Project.find()).vendor_dir
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    parts = [f.read_text(errors="replace") for f in files if f.is_file()]
    if not parts:
        raise UserError(f"{root} has no documentation to draw a text from; run `llama-sparse vendor`")
    return "\n\n".join(parts)


def text_of_tokens(text: str, n_tokens: int, count_tokens: Callable[[str], int], offset: int = 0) -> str:
    """The longest slice of `text` from character `offset` that has at most n_tokens tokens."""
    body = text[offset:]
    while count_tokens(body) < n_tokens:
        body = body + "\n\n" + text
    lo, hi = 0, len(body)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if count_tokens(body[:mid]) <= n_tokens:
            lo = mid
        else:
            hi = mid
    return body[:lo]

