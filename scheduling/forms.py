"""The console's job submission form: checks types here, the rules in the job service."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from devices.models import Device, VnpuTemplate
from npuctl.durations import parse_duration
from quotas.models import Team
from quotas.services import active_policy
from scheduling.services.jobs import MAX_DURATION_S

DURATION_HELP = "Like 2h, 30m, 1h30m, 90s, 1d, 2:00:00 (HH:MM:SS), 1-12:00 (D-HH:MM), or plain seconds."


class DurationField(forms.Field):
    """A duration as people type it (``2h``, ``1h30m``, ``90s``, seconds), cleaned to whole seconds.

    The parser is ``npuctl``'s own (standard library only), so the form and the
    command line accept exactly the same text.
    """

    def __init__(self, *, max_seconds: int = MAX_DURATION_S, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", DURATION_HELP)
        kwargs.setdefault("widget", forms.TextInput(attrs={"maxlength": 40, "placeholder": "e.g. 2h or 1h30m"}))
        super().__init__(**kwargs)
        self.max_seconds = max_seconds

    def prepare_value(self, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    def to_python(self, value: Any) -> int | None:
        text = str(value).strip() if value is not None else ""
        if not text:
            return None
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise forms.ValidationError(f"{self.label}: {exc}") from None
        if seconds > self.max_seconds:
            raise forms.ValidationError(f"{self.label}: {text!r} is longer than {self.max_seconds // 86400} days")
        return seconds


class JobSubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(max_length=200)
    command = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    priority_class = forms.ChoiceField(label="Priority class")
    num_devices = forms.IntegerField(label="Whole devices", min_value=1, max_value=100000, initial=1)
    chip_model = forms.ChoiceField(label="Chip model", required=False)
    vnpu_template = forms.ChoiceField(label="vNPU slice (instead of cards)", required=False)
    estimated_duration_s = DurationField(label="Estimated run time", initial="1h")
    max_duration_s = DurationField(label="Maximum run time", required=False)
    checkpoint_interval_s = DurationField(
        label="Checkpoints every",
        required=False,
        help_text="If the job saves its state this often (e.g. 30m): preempted, it loses only the work since its "
        "last checkpoint, and the scheduler picks victims that lose the least work. Leave empty if it does not.",
    )
    array = forms.IntegerField(
        label="Copies (job array)",
        min_value=1,
        required=False,
        help_text="Leave empty for one job; N queues N copies named name[0] … name[N-1], like Slurm's --array.",
    )

    def __init__(self, *args: object, user: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        teams = Team.objects.all() if getattr(user, "is_staff", False) else Team.objects.filter(memberships__user=user)
        self.fields["team"].queryset = teams
        policy = active_policy().policy
        self.fields["priority_class"].choices = [(c.name, c.name) for c in policy.priority_classes]
        self.fields["priority_class"].initial = policy.default_class.name
        chips = sorted(set(Device.objects.filter(node__removed_at__isnull=True).values_list("chip_model", flat=True)))
        self.fields["chip_model"].choices = [("", "any")] + [(c, c) for c in chips]
        self.fields["vnpu_template"].choices = [("", "none")] + [
            (t.name, f"{t.name} on {t.chip_model} ({t.ai_cores} AI cores, {t.memory_mb // 1024} GB)")
            for t in VnpuTemplate.objects.all()
        ]
        # The API's limit, read at each form so a deployment's setting applies at once.
        self.fields["array"].widget.attrs["max"] = settings.MAX_ARRAY

    def clean_array(self) -> int | None:
        """The API's ``array`` limit (``NPUPORTAL_MAX_ARRAY``); the job service checks the bytes, as for the API."""
        copies: int | None = self.cleaned_data.get("array")
        if copies is not None and copies > settings.MAX_ARRAY:
            raise forms.ValidationError(
                f"Copies (job array): {copies:,} asked; at most {settings.MAX_ARRAY:,} in one array"
            )
        return copies

    def field_for(self, name: str | None) -> str | None:
        """The form field a service error names (the API's ``array`` is this form's too), else the whole form."""
        return name if name in self.fields else None
