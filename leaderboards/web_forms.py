from __future__ import annotations

import json

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
        unavailable = unavailable or {}
        board_gpus = {lb.name: [(g.name, f"{g.name} (unavailable)" if g.name in unavailable else g.name)
                                for g in lb.gpu_types.all()] for lb in leaderboards}
        # the GPU types of the chosen leaderboard only (site.js swaps them when another one is chosen); one asked for
        # that takes no submission preselects none (the page says why), never another
        asked = self.data.get("leaderboard") or self.initial.get("leaderboard")
        chosen = asked if asked in board_gpus else None if asked else next(iter(board_gpus), None)
        choices = [(lb.name, lb.name) for lb in leaderboards]
        if chosen is None and choices:
            choices.insert(0, ("", "Choose an open leaderboard"))
        self.fields["leaderboard"].widget = forms.Select(choices=choices, attrs={"data-gpus": json.dumps(board_gpus)})
        self.fields["gpu"].widget = forms.Select(choices=board_gpus.get(chosen, []))
        self.chosen_gpus = {name for name, _ in board_gpus.get(chosen, [])}  # whose "unavailable" banners show

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload:
            # read one byte past the limit so check_submission reports the size without buffering a huge file
            data["content"], data["file_name"] = upload.read(settings.MAX_SUBMISSION_BYTES + 1), upload.name
            data["size"] = upload.size
        elif "code" in self.errors:  # its own message says what is wrong (e.g. a NUL character)
            return data
        elif data.get("code", "").strip():
            data["content"], data["file_name"] = data["code"].replace("\r\n", "\n").encode(), "submission.py"
        else:
            raise forms.ValidationError("Upload a file or paste your code.")
        return data


class InviteForm(forms.Form):
    """An invite code typed in or carried by an organiser's link; `access.actions.do_join` holds every rule."""

    code = forms.CharField(label="Invitation code", max_length=64,
                           widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false", "size": 34}))
