"""Which teams and roles a person's directory groups give them, by the policy's ``directory`` fields.

A policy names a group by its cn (``ml-team``) or its DN (``cn=ml-team,ou=groups,dc=example,dc=org``);
the directory reports both for LDAP and whatever the identity provider puts in its groups claim for
OIDC. So a name matches a group when they are the same DN or the same cn, without regard to case or to
the spaces a DN may carry after its commas; a cn in the policy also matches a DN whose first part is
that cn, and the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduling.engine.policy import Policy

LEAD = "lead"
MEMBER = "member"


def normal(group: str) -> str:
    """A group's name compared as the directory does: lower case, no spaces around ``,`` and ``=``."""
    if "=" not in group:
        return group.strip().lower()
    parts = []
    for rdn in _split_dn(group):
        attr, _, value = rdn.partition("=")
        parts.append(f"{attr.strip().lower()}={value.strip().lower()}")
    return ",".join(parts)


def _split_dn(dn: str) -> list[str]:
    """A DN's parts, honouring ``\\,`` inside a value."""
    parts, current, escaped = [], [], False
    for ch in dn:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            current.append(ch)
            escaped = True
        elif ch == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _cn(group: str) -> str:
    """The value of a DN's first part (``ml-team`` of ``cn=ml-team,ou=groups,...``); a cn is itself."""
    norm = normal(group)
    if "=" not in norm:
        return norm
    return _split_dn(norm)[0].partition("=")[2]


@dataclass(frozen=True)
class Groups:
    """The groups a directory reports for one person, ready for matching."""

    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, groups: Iterable[str]) -> Groups:
        return cls(frozenset(normal(g) for g in groups if g and g.strip()))

    def has(self, policy_group: str | None) -> bool:
        if not policy_group:
            return False
        wanted = normal(policy_group)
        if wanted in self.names:
            return True
        cn = _cn(wanted)
        if "=" in wanted:  # the policy gives a DN: a bare cn reported for it matches
            return cn in self.names
        return any("=" in name and _cn(name) == cn for name in self.names)


@dataclass(frozen=True)
class DirectoryRoles:
    """What the directory makes a person: a role in each directory-run team, finance, admin.

    ``finance``/``admin`` are ``None`` when the policy names no group for that role: then the
    directory does not decide it, and whatever an admin set by hand stays.
    """

    teams: dict[str, str] = field(default_factory=dict)
    finance: bool | None = None
    admin: bool | None = None


def directory_teams(policy: Policy) -> dict[str, tuple[str, str | None]]:
    """The teams run from the directory: team name -> (members group, leads group)."""
    return {
        name: (team.directory.members, team.directory.leads)
        for name, team in policy.teams.items()
        if team.directory is not None
    }


def roles_for(policy: Policy, groups: Groups) -> DirectoryRoles:
    """The teams and roles ``groups`` give under ``policy``: a lead where in the leads group."""
    teams: dict[str, str] = {}
    for name, (members, leads) in directory_teams(policy).items():
        if groups.has(leads):
            teams[name] = LEAD
        elif groups.has(members):
            teams[name] = MEMBER
    roles = policy.directory
    return DirectoryRoles(
        teams=teams,
        finance=groups.has(roles.finance) if roles.finance else None,
        admin=groups.has(roles.admins) if roles.admins else None,
    )


def mapped_groups(policy: Policy) -> list[str]:
    """Every group the policy names, so a sync knows whose members to look up."""
    out: list[str] = []
    for members, leads in directory_teams(policy).values():
        out += [members] + ([leads] if leads else [])
    out += [g for g in (policy.directory.finance, policy.directory.admins) if g]
    return list(dict.fromkeys(out))
