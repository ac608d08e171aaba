"""The console's job submission form: checks types here, the rules in the job service.

A job is a command line, or a batch script (typed or uploaded) whose ``#NPU`` and ``#SBATCH``
directives are read by ``npuctl.batch``, the parser ``npuctl batch`` uses: a form field the user
changed wins over a directive, as a command-line flag does.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings

from devices.models import Device, VnpuTemplate
from npuctl.batch import ScriptError, read_script
from npuctl.durations import format_duration, parse_duration
from quotas.models import Team
from quotas.policies.versions import active_policy
from quotas.tenancy.visibility import visible_teams
from scheduling.services.jobs import MAX_DURATION_S, JobSpec

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
        return format_duration(value) if isinstance(value, int) and not isinstance(value, bool) else value

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


@dataclass
class Submission:
    """What the form asks to submit: the team, the job, how many copies, and the directives not honoured."""

    team: Team
    spec: JobSpec
    copies: int | None
    warning: str | None = None


#: Form fields a directive may fill, by the API's field name (the form's own names are the same).
_DIRECTIVE_FIELDS = (
    "name",
    "num_devices",
    "chip_model",
    "vnpu_template",
    "priority_class",
    "estimated_duration_s",
    "max_duration_s",
    "checkpoint_interval_s",
    "array",
)


class JobSubmitForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(
        max_length=200, required=False, help_text="Default: the command's program, or the script's job name."
    )
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="A command line, run with /bin/sh -c on the node. Or give a batch script below.",
    )
    script = forms.CharField(
        label="Batch script",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "class": "script", "spellcheck": "false"}),
        help_text="Instead of a command: a script run by its #! interpreter (default bash). Its #NPU and "
        "#SBATCH directives (--gres=npu:N, --time, --output, ...) fill the fields below you leave as they are.",
    )
    script_file = forms.FileField(label="or upload a script", required=False)
    script_args = forms.CharField(
        label="Script arguments", required=False, help_text="As on a command line: quote an argument with spaces."
    )
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
        teams = visible_teams(user)
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
        # Initial values as the form shows them, so a field left alone is known to be (a directive fills it).
        self.fields["team"].initial = teams.order_by("name").first()
        self.fields["team"].queryset = teams.order_by("name")
        self.fields["estimated_duration_s"].initial = 3600
        self._batch: Any = None

    def clean_script_args(self) -> list[str]:
        text: str = self.cleaned_data.get("script_args") or ""
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Script arguments: {exc}") from None

    def clean(self) -> dict[str, Any]:
        """A command or a script (typed or uploaded), one of them; a script's directives are read here."""
        data = super().clean()
        upload = data.get("script_file")
        # A browser sends a textarea's lines ended by \r\n (the HTML rule), whatever the user typed.
        typed = (data.get("script") or "").replace("\r\n", "\n")
        given = [name for name, value in (("command", data.get("command")), ("script", typed.strip())) if value]
        if upload:
            given.append("script_file")
        if not given:
            self.add_error("command", "Give a command, or a batch script.")
            return data
        if len(given) > 1:
            self.add_error(given[1], "Give a command or one script, not both.")
            return data
        if given[0] == "command":
            return data
        field = given[0]
        text, filename = (typed, "") if field == "script" else (self._read_upload(upload), upload.name)
        if text is None:
            return data
        try:
            self._batch = read_script(text, data.get("script_args") or [], name=os.path.basename(filename or ""))
        except ScriptError as exc:
            self.add_error(field, f"Batch script: {exc}")
        return data

    def _read_upload(self, upload: Any) -> str | None:
        """The uploaded script's text, or ``None`` with an error on the field (too large, not UTF-8)."""
        limit = settings.MAX_COMMAND_BYTES
        data = upload.read(limit + 1)
        if len(data) > limit:
            self.add_error("script_file", f"The script is over {limit:,} bytes, the longest command a job takes.")
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f"byte 0x{data[exc.start]:02x} at {exc.start}"
            self.add_error("script_file", f"The script is not UTF-8 text ({where}).")
            return None

    def submission(self) -> Submission | None:
        """The job to submit, from a valid form; ``None`` (with the error on its field) when a directive is refused.

        For a script, each directive fills the field of the same meaning unless the user changed
        that field on the form; ``env``, ``cwd`` and ``output`` (no fields here) come from the directives.
        """
        data = dict(self.cleaned_data)
        batch = self._batch
        extra: dict[str, Any] = {}
        warning = None
        if batch is not None:
            changed = set(self.changed_data)
            for key, value in batch.fields.items():
                if key in _DIRECTIVE_FIELDS and key not in changed:
                    data[key] = value
                elif key in ("env", "cwd", "output"):
                    extra[key] = value
            limit = data["max_duration_s"]
            if batch.estimate_is_limit and "estimated_duration_s" not in changed and limit is not None:
                data["estimated_duration_s"] = min(data["estimated_duration_s"], limit)  # sbatch's --time was a limit
            if "team" in batch.fields and "team" not in changed:
                team = self.fields["team"].queryset.filter(name=batch.fields["team"]).first()
                if team is None:
                    self.add_error("team", f"The script's --account {batch.fields['team']!r} is not a team of yours.")
                    return None
                data["team"] = team
            warning = batch.warning()
        command = batch.command if batch is not None else data["command"]
        name = (data.get("name") or "").strip() or os.path.basename(command.split()[0])[:200] or "job"
        spec = JobSpec(
            name=name,
            command=command,
            priority_class=data["priority_class"],
            num_devices=data["num_devices"],
            chip_model=data["chip_model"] or None,
            vnpu_template=data["vnpu_template"] or None,
            estimated_duration_s=data["estimated_duration_s"],
            max_duration_s=data["max_duration_s"],
            checkpoint_interval_s=data["checkpoint_interval_s"],
            env=extra.get("env", {}),
            cwd=extra.get("cwd", ""),
            output=extra.get("output", ""),
        )
        return Submission(data["team"], spec, data["array"], warning)

    def clean_array(self) -> int | None:
        """The API's ``array`` limit (``NPUPORTAL_MAX_ARRAY``); the job service checks the bytes, as for the API."""
        copies: int | None = self.cleaned_data.get("array")
        if copies is not None and copies > settings.MAX_ARRAY:
            raise forms.ValidationError(
                f"Copies (job array): {copies:,} asked; at most {settings.MAX_ARRAY:,} in one array"
            )
        return copies

    def field_for(self, name: str | None) -> str | None:
        """The form field a service error names (the API's ``array`` is this form's too), else the whole form.

        A script's job names its command ``command``: the error belongs to the script it came from.
        """
        if name == "command" and self._batch is not None:
            return "script_file" if self.cleaned_data.get("script_file") else "script"
        return name if name in self.fields else None
