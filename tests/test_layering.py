"""Dependencies between the apps point one way: the GPU side (runners, reservations) never imports the competition
side or its front-ends; it reports upwards through signals and hooks named in settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ABOVE = {"runners": ("leaderboards", "discordbot")}


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("app", list(ABOVE))
def test_an_app_never_imports_the_apps_above_it(app):
    offenders = {str(path.relative_to(REPO)): sorted(m for m in imported_modules(path) if m.split(".")[0] in ABOVE[app])
                 for path in (REPO / app).rglob("*.py")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}
