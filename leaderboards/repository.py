"""Problems from a repository (KernelBot's `/admin update-problems`): a branch's zip downloaded, unpacked safely and
its `problems/<set>.yaml` competition files imported with `do_import_competition`, as `import_problems` does with a
directory on disk."""

from __future__ import annotations

import io
import re
import stat
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import transaction

from taskspec.loader import TaskFileError, load_competition

from .importing import ImportRejected, do_import_competition
from .models import Leaderboard

REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,38}/[A-Za-z0-9_.-]{1,100}")
BRANCH = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # no slashes, as KernelBot
MAX_BYTES = 64 << 20  # the download, and what it unpacks to
MAX_MEMBERS = 20_000
TIMEOUT = 60


class RepositoryError(Exception):
    """Why a repository's problems could not be read: the organiser's message."""


@dataclass
class RepositoryImport:
    imported: list[str] = field(default_factory=list)  # one line per leaderboard
    errors: list[str] = field(default_factory=list)  # one per competition file refused (nothing of it imported)
    created: list[str] = field(default_factory=list)  # leaderboard names
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def archive_url(repository: str, branch: str) -> str:
    if not REPOSITORY.fullmatch(repository) or ".." in repository:
        raise RepositoryError(f"'{repository[:120]}' is not a repository name (owner/name).")
    if not BRANCH.fullmatch(branch) or ".." in branch:
        raise RepositoryError(f"'{branch[:120]}' is not a branch name this command takes (no slashes).")
    return settings.PROBLEMS_ARCHIVE_URL.format(repository=repository, branch=branch)


def download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:  # noqa: S310 - an http(s) URL we built
            data = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise RepositoryError(f"{url} answered {exc.code}: no such repository or branch?") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RepositoryError(f"could not download {url}: {getattr(exc, 'reason', exc)}") from None
    if len(data) > MAX_BYTES:
        raise RepositoryError(f"{url} is larger than {MAX_BYTES >> 20} MiB.")
    return data


def unpack(data: bytes, dest: Path) -> Path:
    """The archive under `dest` (no member outside it, no links, bounded size); its one top folder."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise RepositoryError("the download is not a zip archive.") from None
    members = archive.infolist()
    if len(members) > MAX_MEMBERS or sum(m.file_size for m in members) > MAX_BYTES:
        raise RepositoryError(f"the archive holds more than {MAX_MEMBERS} files or {MAX_BYTES >> 20} MiB.")
    for member in members:
        path = PurePosixPath(member.filename)
        if path.is_absolute() or ".." in path.parts or stat.S_ISLNK(member.external_attr >> 16):
            raise RepositoryError(f"unsafe member {member.filename!r} in the archive.")
    archive.extractall(dest)
    tops = {PurePosixPath(m.filename).parts[0] for m in members if m.filename.strip("/")}
    return dest / tops.pop() if len(tops) == 1 else dest


def do_import_repository(repository: str, branch: str = "main", problem_set: str | None = None, *,
                         force: bool = False, visibility: str | None = None,
                         downloaded: tuple[str, bytes | RepositoryError] | None = None) -> RepositoryImport:
    """Import `problems/<problem_set>.yaml` of the repository's branch, or every competition file there (`force`
    only with one set, as KernelBot). `visibility`: what the leaderboards it creates get (KernelBot's `--closed`);
    existing ones keep theirs. `downloaded`: (url, its bytes or why not), fetched already (`popcorn.api.prefetch`)."""
    if force and not problem_set:
        raise RepositoryError("force needs a problem set: name the one whose leaderboards may change.")
    url = archive_url(repository, branch)
    if downloaded is not None and downloaded[0] == url:
        if isinstance(downloaded[1], RepositoryError):
            raise downloaded[1]
        data = downloaded[1]
    else:
        data = download(url)
    result = RepositoryImport()
    with tempfile.TemporaryDirectory(prefix="kernelbot-problems-") as temp:
        problems = unpack(data, Path(temp)) / "problems"
        available = sorted(p for p in problems.glob("*.yaml") if p.is_file()) if problems.is_dir() else []
        if problem_set:
            chosen = [p for p in available if p.stem == problem_set]
            if not chosen:
                raise RepositoryError(f"no problem set '{problem_set[:100]}' in {repository}@{branch}; available: "
                                      f"{', '.join(p.stem for p in available) or 'none (no problems/*.yaml)'}.")
        else:
            chosen = available
            if not chosen:
                raise RepositoryError(f"{repository}@{branch} has no problems/*.yaml.")
        for path in chosen:
            try:
                with transaction.atomic():
                    report = do_import_competition(load_competition(path, root=problems), force=force)
                    if visibility and report.created:
                        Leaderboard.objects.filter(name__in=report.created).update(visibility=visibility)
            except (TaskFileError, ImportRejected) as exc:
                result.errors.append(f"{path.stem}: " + "; ".join(getattr(exc, "errors", None) or [str(exc)]))
                continue
            result.imported += report.lines
            result.created += report.created
            result.updated += report.updated
            result.unchanged += report.unchanged
    return result
