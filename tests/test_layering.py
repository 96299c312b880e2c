"""Dependencies between the apps point one way: the GPU side (runners, reservations) never imports the competition
side or its front-ends; it reports upwards through signals and hooks named in settings. The `kernelbot` CLI and
`taskspec` (the task model it shares with the server) import nothing of Django."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
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


# What `kernelbot` (the CLI competitors install) and `taskspec` (what it shares with the server) may not import:
# Django, its apps, and the platform's side of runners (runners.harness is plain Python and ships to GPU nodes).
DJANGO_SIDE = ("django", "leaderboards", "discordbot", "runners")
CLIENT_SIDE = ("kernelbot/cli", "taskspec")


def django_side(module: str) -> bool:
    if module == "runners.harness" or module.startswith("runners.harness."):
        return False
    if module.split(".")[0] in DJANGO_SIDE:
        return True
    path = REPO / (module.replace(".", "/") + ".py")
    return module.startswith("kernelbot.") and not module.startswith("kernelbot.cli") and path.is_file() and any(
        django_side(m) for m in imported_modules(path))


@pytest.mark.parametrize("package", CLIENT_SIDE)
def test_the_cli_and_taskspec_import_nothing_of_django(package):
    offenders = {str(path.relative_to(REPO)): sorted(m for m in imported_modules(path) if django_side(m))
                 for path in (REPO / package).rglob("*.py")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_the_installed_cli_has_every_package_it_imports():
    import tomllib

    included = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    ours = {m.split(".")[0] for package in CLIENT_SIDE for path in (REPO / package).rglob("*.py")
            for m in imported_modules(path) if (REPO / m.split(".")[0]).is_dir()}
    assert ours and all(f"{top}*" in included for top in ours), (ours, included)


@pytest.mark.slow
def test_kernelbot_run_problem_loads_no_django():
    """`kernelbot run --problem` as the README shows it; at exit, no Django module was ever imported."""
    script = ("import atexit, sys\n"
              "atexit.register(lambda: print('IMPORTED', sorted(m for m in sys.modules if m.split('.')[0] in "
              f"{DJANGO_SIDE!r} and not m.startswith('runners.harness') and m != 'runners')))\n"
              "sys.argv = ['kernelbot', 'run', '--problem', 'problems/demo/vectoradd_py', "
              "'problems/demo/vectoradd_py/solutions/fast.py']\n"
              "from kernelbot.cli.main import app\napp()\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert "verdict: pass" in done.stdout, done.stdout + done.stderr
    assert "IMPORTED []" in done.stdout, done.stdout
