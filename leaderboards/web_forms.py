from __future__ import annotations

from django import forms
from django.conf import settings

from .models import SubmissionMode


class SubmitForm(forms.Form):
    """Collects the raw bytes; every rule about them lives in `actions.check_submission`."""

    leaderboard = forms.CharField()
    gpu = forms.CharField(label="GPU type")
    mode = forms.ChoiceField(choices=SubmissionMode.choices, initial=SubmissionMode.LEADERBOARD)
    file = forms.FileField(required=False, help_text="Upload a file, or paste the code below.")
    code = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}))

    def __init__(self, *args, leaderboards: list, unavailable: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["leaderboard"].widget = forms.Select(choices=[(lb.name, lb.name) for lb in leaderboards])
        gpus = sorted({g.name for lb in leaderboards for g in lb.gpu_types.all()})
        unavailable = unavailable or {}
        self.fields["gpu"].widget = forms.Select(choices=[(g, f"{g} (unavailable)" if g in unavailable else g)
                                                          for g in gpus])

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload:
            # read one byte past the limit so check_submission reports the size without buffering a huge file
            data["content"], data["file_name"] = upload.read(settings.MAX_SUBMISSION_BYTES + 1), upload.name
        elif "code" in self.errors:  # its own message says what is wrong (e.g. a NUL character)
            return data
        elif data.get("code", "").strip():
            data["content"], data["file_name"] = data["code"].replace("\r\n", "\n").encode(), "submission.py"
        else:
            raise forms.ValidationError("Upload a file or paste your code.")
        return data
