"""Console forms of the quotas app: they collect text; the rules and messages live in the services."""

from __future__ import annotations

from collections.abc import Mapping

from django import forms

from quotas.policies.team_policy import MAX_COMMENT_CHARS, NON_FIELD, TeamSettings, resource_keys


def _num(value: float) -> str:
    """The exact number as text (``50``, ``2.5``): a rounded value would be saved back as a change."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class TeamPolicyForm(forms.Form):
    """One team's weight and base guaranteed/max per resource, plus the comment kept in the history.

    Every field is plain text: :func:`quotas.policies.team_policy.change_team` reads
    and checks the numbers, so a bad value gets the same message here as in
    the API. Resource fields are named ``guaranteed__<key>`` and
    ``max__<key>`` (``/`` becomes ``__``) so ids stay usable in CSS and tests;
    :meth:`service_field` maps a service error back to them.
    """

    shares = forms.CharField(
        label="Weight (shares)",
        required=False,
        help_text="Fair-share weight among the team's siblings in the department; only ratios matter.",
        widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 8}),
    )
    comment = forms.CharField(
        label="Comment (required)",
        required=False,
        max_length=MAX_COMMENT_CHARS,
        help_text="Why: kept with the new policy version in the history.",
        widget=forms.TextInput(attrs={"size": 60}),
    )
    base_version = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def __init__(
        self, *args: object, current: TeamSettings, chip_models: list[str], base_version: int | None, **kwargs: object
    ) -> None:
        initial: dict[str, object] = {"shares": _num(current.shares), "base_version": base_version}
        self.keys = resource_keys(current, chip_models)
        for key in self.keys:
            initial[self.field_name("guaranteed", key)] = (
                _num(current.guaranteed[key]) if key in current.guaranteed else ""
            )
            initial[self.field_name("max", key)] = _num(current.max[key]) if key in current.max else ""
        super().__init__(*args, initial=initial, **kwargs)  # type: ignore[arg-type]
        for key in self.keys:
            for kind, label, blank in (("guaranteed", "Guaranteed", "none"), ("max", "Max", "no cap")):
                self.fields[self.field_name(kind, key)] = forms.CharField(
                    label=f"{label} {key}",
                    required=False,
                    widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 6, "placeholder": blank}),
                )
        self.order_fields(["shares", *(self.field_name(k, r) for r in self.keys for k in ("guaranteed", "max"))])

    @staticmethod
    def field_name(kind: str, key: str) -> str:
        return f"{kind}__{key.replace('/', '__')}"

    def shares_sent(self) -> str | None:
        """The submitted weight; ``None`` when the request has no such field (keep the weight)."""
        return self.cleaned_data.get("shares", "") if self.add_prefix("shares") in self.data else None

    def resources(self, kind: str) -> dict[str, str]:
        """The submitted ``guaranteed`` or ``max`` amounts by resource key (blank: remove the key).

        A field missing from the request (a script posting only ``shares``)
        is left out, so it keeps its value rather than reading as blank.
        """
        names = {key: self.field_name(kind, key) for key in self.keys}
        return {
            key: self.cleaned_data.get(name, "") for key, name in names.items() if self.add_prefix(name) in self.data
        }

    def service_field(self, name: str) -> str | None:
        """The form field of a service error key (``max.devices/910B4`` → ``max__devices__910B4``)."""
        if name == NON_FIELD:
            return None
        if "." in name:
            kind, key = name.split(".", 1)
            name = self.field_name(kind, key)
        return name if name in self.fields else None

    def add_service_errors(self, errors: Mapping[str, str]) -> None:
        for name, message in errors.items():
            target = self.service_field(name)
            if target is None and name not in (NON_FIELD, "base_version"):
                message = f"{name}: {message}"  # a key the form does not show: name it in the summary
            self.add_error(target if target != "base_version" else None, message)

    def rows(self) -> list[tuple[str, forms.BoundField, forms.BoundField]]:
        """``(resource key, guaranteed field, max field)`` per resource, for the quota table."""
        return [(key, self[self.field_name("guaranteed", key)], self[self.field_name("max", key)]) for key in self.keys]
