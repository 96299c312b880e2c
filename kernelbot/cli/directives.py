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


def with_header(source: str, file_name: str, leaderboard: str, gpus: list[str]) -> str:
    """A template as KernelBot serves it: `#!POPCORN leaderboard <name>` (and `#!POPCORN gpu <gpu>` when the board
    has one GPU type) first, so that submitting it unchanged names its board; directives it had are replaced."""
    mark = "//" if file_name.rsplit(".", 1)[-1].lower() in ("cu", "cuh", "cpp", "cc", "c", "h", "hpp") else "#"
    header = [f"{mark}!POPCORN leaderboard {leaderboard}"] + ([f"{mark}!POPCORN gpu {gpus[0]}"] if len(gpus) == 1
                                                              else [])
    lines = source.splitlines(keepends=True)
    code_at = next((i for i, line in enumerate(lines) if line.strip() and not line.strip().startswith(("#", "//"))),
                   len(lines))
    kept = [line for i, line in enumerate(lines) if i >= code_at or not DIRECTIVE.match(line)]
    return "\n".join(header) + "\n" + "".join(kept)
