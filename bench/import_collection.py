"""Import a whole problem collection (a gpu-mode/reference-kernels checkout's `problems/`) as an organiser would:
create the GPU types it names, then run `import_problems` on every competition file and every problem directory.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kernelbot_importbench python bench/import_collection.py \\
        path/to/reference-kernels/problems

Use a scratch database: it migrates it and writes leaderboards. Prints each import's report or refusal and
the counts that imported."""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")

import django  # noqa: E402

django.setup()

import yaml  # noqa: E402
from django.core.management import CommandError, call_command  # noqa: E402

from runners.models import GpuType  # noqa: E402


def gpu_names(root: Path) -> set[str]:
    names: set[str] = set()
    for path in [*root.glob("*.yaml"), *root.rglob("task.yml")]:
        raw = yaml.safe_load(path.read_text()) or {}
        names.update(raw.get("gpus") or [])
        for problem in raw.get("problems") or []:
            names.update(problem.get("gpus") or [])
    return names


def imports(label: str, path: Path) -> bool:
    out = io.StringIO()
    try:
        call_command("import_problems", str(path), stdout=out)
    except CommandError as exc:
        print(f"REFUSED {label}\n    " + str(exc).replace("\n", "\n    "))
        return False
    print(f"OK {label}\n    " + out.getvalue().strip().replace("\n", "\n    "))
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", type=Path, help="the collection's problems/ directory")
    root = parser.parse_args().problems.resolve()
    call_command("migrate", verbosity=0)
    for name in sorted(gpu_names(root)):
        GpuType.objects.get_or_create(name=name)
    competitions = sorted(root.glob("*.yaml"))
    directories = sorted(path.parent for path in root.rglob("task.yml"))
    ok_competitions = sum(imports(path.name, path) for path in competitions)
    ok_directories = sum(imports(str(path.relative_to(root)), path) for path in directories)
    print(f"competition files: {ok_competitions}/{len(competitions)}; "
          f"problem directories: {ok_directories}/{len(directories)}")


if __name__ == "__main__":
    main()
