"""`#!POPCORN` directives in a submission's leading comment block (`//!POPCORN` in CUDA/C++)."""

from __future__ import annotations

import re

DIRECTIVE = re.compile(r"^\s*(?:#|//)!POPCORN\s+(\w+)\s+(.+?)\s*$", re.IGNORECASE)


def parse_directives(source: str) -> dict[str, str]:
    """`{"leaderboard": ..., "gpu": ...}` from the comment lines before the first line of code.
    `gpus` is read as `gpu`; later lines of the same key win."""
    found: dict[str, str] = {}
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "//")):
            break
        match = DIRECTIVE.match(line)
        if match:
            key = match.group(1).lower()
            found["gpu" if key == "gpus" else key] = match.group(2)
    return found
