import secrets
import time

from django import forms
from django.conf import settings
from django.utils import timezone

from .models import HarnessProtocol


class ProblemUploadForm(forms.Form):
    """The admin's zip import. An import that changes an existing leaderboard is shown first (a preview); the zip
    waits on the server meanwhile (`staged`), so confirming does not ask for the file again."""

    archive = forms.FileField(required=False, help_text=(
        "A zip of a reference-kernels problem: its folder with task.yml and the files it names. A file task.yml "
        "reaches with ../ (a shared utils.py, eval.py) goes where that path points, so put the problem in a "
        "folder: set/vectoradd/task.yml naming ../utils.py needs set/utils.py beside that folder. "
        "One problem per zip (exactly one task.yml); a whole collection is imported from its competition file "
        "with import_problems."))
    harness = forms.ChoiceField(choices=[("auto", "Automatic (the eval.py config.main names if it is among the files, "
                                                  "else the trusted harness)"),
                                         *HarnessProtocol.choices], initial="auto")
    leaderboard = forms.SlugField(required=False, help_text="Also open or update this leaderboard.")
    deadline = forms.DateTimeField(required=False, help_text="UTC, e.g. 2027-01-31 23:59. Empty: an existing "
                                   "leaderboard keeps its deadline, a new one closes in a year.")
    past_deadline = forms.BooleanField(required=False, label="The deadline is in the past on purpose",
                                       help_text="Tick to import a leaderboard that is closed from the start.")
    gpus = forms.CharField(required=False, label="GPU types", help_text="Comma-separated. Empty: an existing "
                           "leaderboard keeps its GPU types, a new one takes the task's gpus.")
    reset = forms.BooleanField(required=False, label="Take these values", help_text="Write the deadline and GPU "
                               "types above even where they were changed in the admin since the last import (without "
                               "it, an existing leaderboard takes only values that differ from its last import's).")
    force = forms.BooleanField(required=False, label="Force", help_text="Allow changing a running leaderboard's "
                               "problem (its past submissions keep the version they ran), or a problem whose code "
                               "asks for CUDA on GPU types without it.")
    staged = forms.RegexField(regex=r"^[0-9a-f]{32}$", required=False, widget=forms.HiddenInput)
    staged_name = forms.CharField(required=False, max_length=255, widget=forms.HiddenInput)

    MAX_ARCHIVE_BYTES = 16 << 20
    STAGED_DAYS = 1

    @staticmethod
    def staged_path(token: str):
        return settings.DATA_DIR / "imports" / f"{token}.zip"

    def archive_bytes(self) -> tuple[bytes, str]:
        """The uploaded zip and its file name, or the one staged by the preview."""
        if archive := self.cleaned_data.get("archive"):
            return archive.read(), archive.name
        return self.staged_path(self.cleaned_data["staged"]).read_bytes(), self.cleaned_data["staged_name"]

    def stage(self, data: bytes) -> str:
        """Keeps the zip for the confirmation; forgets zips staged more than a day ago."""
        folder = self.staged_path("x").parent
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.zip"):
            if old.stat().st_mtime < time.time() - self.STAGED_DAYS * 86400:
                old.unlink(missing_ok=True)
        token = secrets.token_hex(16)
        self.staged_path(token).write_bytes(data)
        return token

    def unstage(self) -> None:
        if token := self.cleaned_data.get("staged"):
            self.staged_path(token).unlink(missing_ok=True)

    def clean_archive(self):
        archive = self.cleaned_data["archive"]
        if archive and archive.size > self.MAX_ARCHIVE_BYTES:
            raise forms.ValidationError(f"The archive is {archive.size} bytes; the limit is "
                                        f"{self.MAX_ARCHIVE_BYTES} bytes.")
        return archive

    def clean(self):
        data = super().clean()
        kept = data.get("staged") and self.staged_path(data["staged"]).is_file()
        if not data.get("archive") and not kept and "archive" not in self.errors:
            self.add_error("archive", "Choose a zip of the problem." if not data.get("staged") else
                               "The zip kept for this import is gone (over a day old?): choose it again.")
        data["gpu_names"] = [g.strip() for g in (data.get("gpus") or "").split(",") if g.strip()]
        deadline = data.get("deadline")
        if deadline and deadline <= timezone.now() and not data.get("past_deadline"):
            self.add_error("deadline", f"{deadline:%Y-%m-%d %H:%M} UTC is in the past: the leaderboard would be "
                                       "closed at once. Correct it, or tick “The deadline is in the past on "
                                       "purpose”.")
        return data

    def ask_for_the_file_again(self) -> None:
        """A browser never re-fills a file input, so a refused form says so instead of looking as if it kept it."""
        chosen = self.files.get("archive")
        name = f" ({chosen.name})" if chosen else ""
        text = f"Choose the zip again{name}: the browser does not keep it after a refused import. "
        self.fields["archive"].help_text = self["archive"].help_text = text + self.fields["archive"].help_text
