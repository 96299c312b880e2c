from django import forms

from .models import HarnessProtocol


class ProblemUploadForm(forms.Form):
    archive = forms.FileField(help_text="A zip of a reference-kernels problem directory (task.yml and its files).")
    harness = forms.ChoiceField(choices=[("auto", "Automatic (the eval.py config.main names if it is among the files, "
                                                  "else the trusted harness)"),
                                         *HarnessProtocol.choices], initial="auto")
    leaderboard = forms.SlugField(required=False, help_text="Also open or update this leaderboard.")
    deadline = forms.DateTimeField(required=False, help_text="UTC, e.g. 2027-01-31 23:59. Empty: an existing "
                                   "leaderboard keeps its deadline, a new one closes in a year.")
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
        return data
