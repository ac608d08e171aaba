"""The console's job submission form: checks types here, the rules in the job service."""

from __future__ import annotations

from django import forms

from devices.models import Device, VnpuTemplate
from quotas.models import Team
from quotas.services import active_policy
from scheduling.services.jobs import MAX_DURATION_S


class JobSubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(max_length=200)
    command = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    priority_class = forms.ChoiceField(label="Priority class")
    num_devices = forms.IntegerField(label="Whole devices", min_value=1, max_value=100000, initial=1)
    chip_model = forms.ChoiceField(label="Chip model", required=False)
    vnpu_template = forms.ChoiceField(label="vNPU slice (instead of cards)", required=False)
    estimated_duration_s = forms.IntegerField(
        label="Estimated run time (s)", min_value=1, max_value=MAX_DURATION_S, initial=3600
    )
    max_duration_s = forms.IntegerField(
        label="Maximum run time (s)", min_value=1, max_value=MAX_DURATION_S, required=False
    )

    def __init__(self, *args: object, user: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        teams = Team.objects.all() if getattr(user, "is_staff", False) else Team.objects.filter(memberships__user=user)
        self.fields["team"].queryset = teams
        policy = active_policy().policy
        self.fields["priority_class"].choices = [(c.name, c.name) for c in policy.priority_classes]
        self.fields["priority_class"].initial = policy.default_class.name
        chips = sorted(set(Device.objects.values_list("chip_model", flat=True)))
        self.fields["chip_model"].choices = [("", "any")] + [(c, c) for c in chips]
        self.fields["vnpu_template"].choices = [("", "none")] + [
            (t.name, f"{t.name} on {t.chip_model} ({t.ai_cores} AI cores, {t.memory_mb // 1024} GB)")
            for t in VnpuTemplate.objects.all()
        ]
