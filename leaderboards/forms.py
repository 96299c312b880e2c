from django import forms
from django.utils import timezone

from .models import HarnessProtocol


class ProblemUploadForm(forms.Form):
    archive = forms.FileField(help_text=(
        "A zip of a reference-kernels problem: its folder with task.yml and the files it names. A file task.yml "
        "reaches with ../ (a shared utils.py, eval.py) goes where that path points, so put the problem in a "
        "folder: set/vectoradd/task.yml naming ../utils.py needs set/utils.py beside that folder. "
        "Zipping the whole collection works too."))
    harness = forms.ChoiceField(choices=[("auto", "Automatic (the eval.py config.main names if it is among the files, "
                                                  "else the trusted harness)"),
                                         *HarnessProtocol.choices], initial="auto")
    leaderboard = forms.SlugField(required=False, help_text="Also open or update this leaderboard.")
    deadline = forms.DateTimeField(required=False, help_text="UTC, e.g. 2027-01-31 23:59. Empty: an existing "
                                   "leaderboard keeps its deadline, a new one closes in a year.")
    past_deadline = forms.BooleanField(required=False, label="The deadline is in the past on purpose",
                                       help_text="Tick to import a leaderboard that is closed from the start.")
    gpus = forms.CharField(required=False, help_text="Comma-separated GPU types; defaults to the task's gpus.")
    force = forms.BooleanField(required=False, help_text="Allow changing a running leaderboard's problem.")

    MAX_ARCHIVE_BYTES = 16 << 20

    def clean_archive(self):
        archive = self.cleaned_data["archive"]
        if archive.size > self.MAX_ARCHIVE_BYTES:
            raise forms.ValidationError(f"The archive is {archive.size} bytes; the limit is "
                                        f"{self.MAX_ARCHIVE_BYTES} bytes.")
        return archive

    def clean(self):
        data = super().clean()
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
