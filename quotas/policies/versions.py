"""Policy versions: create, activate, roll back, and the parsed active policy.

Every change goes through here so it is validated, audited and takes effect at
the next tick; views, the API and commands only collect input and call these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from threading import Lock

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from quotas.models import AuditEvent, Policy
from scheduling.engine.policy import Policy as ParsedPolicy
from scheduling.engine.policy import PolicyError, parse_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActivePolicy:
    version: int | None
    record: Policy | None
    policy: ParsedPolicy


_cache: dict[tuple[int, str], ParsedPolicy] = {}
_cache_lock = Lock()
_FALLBACK_YAML = "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nmetadata: {name: builtin}\nspec: {}\n"


def parsed(record: Policy) -> ParsedPolicy:
    """Parse a stored version once per process.

    Keyed by version *and* text: versions are never edited, but a database that
    is rebuilt (tests, a restored backup) may reuse a number for other text.
    """
    key = (record.version, record.yaml_text)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    result = parse_policy(record.yaml_text)
    with _cache_lock:
        if len(_cache) > 64:
            _cache.clear()
        _cache[key] = result
    return result


#: The active version's record and parsed policy, by what identifies that activation (see ``active_policy``).
_active_cache: dict[tuple[object, ...], ActivePolicy] = {}


def _active_row() -> tuple[object, ...] | None:
    """``(id, version, created, activated_at)`` of the active version: one read of a tiny indexed row.

    Every job submission asks which policy is active. Written as SQL because the ORM
    spends several times longer compiling this query than the database takes to answer it.
    """
    meta = Policy._meta
    quote = connection.ops.quote_name
    columns = ", ".join(quote(meta.get_field(name).column) for name in ("id", "version", "created", "activated_at"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {quote(meta.db_table)} WHERE {quote(meta.get_field('is_active').column)} = %s",
            [True],
        )
        return cursor.fetchone()


def active_policy() -> ActivePolicy:
    """The active version, or the built-in defaults when none was ever applied.

    The record and its parsed policy are kept per activation — the row's id, version,
    creation and activation times, so a rebuilt database reusing a number, or a
    version activated again, is read afresh — and shared read-only by callers.
    """
    row = _active_row()
    if row is None:
        return ActivePolicy(None, None, _fallback())
    hit = _active_cache.get(row)
    if hit is not None:
        return hit
    record = Policy.objects.filter(pk=row[0]).first()
    if record is None:  # replaced between the two reads
        return active_policy()
    try:
        result = ActivePolicy(record.version, record, parsed(record))
    except PolicyError:
        # Only validated text is stored, but a code change could reject old text:
        # scheduling must go on, so fall back loudly rather than stop the cluster.
        log.exception("active policy v%s no longer parses; using built-in defaults", record.version)
        return ActivePolicy(record.version, record, _fallback())
    with _cache_lock:
        if len(_active_cache) > 16:
            _active_cache.clear()
        _active_cache[row] = result
    return result


def _fallback() -> ParsedPolicy:
    """The built-in defaults, parsed once per process."""
    key = (0, _FALLBACK_YAML)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:
        hit = parse_policy(_FALLBACK_YAML)
        with _cache_lock:
            _cache[key] = hit
    return hit


def cluster_facts() -> tuple[set[str], dict[str, float]]:
    """Chip models and healthy capacity per resource key, for validating a policy against this cluster."""
    from devices.models import Device
    from scheduling.engine.policy import DEVICES, chip_resource

    chips: set[str] = set()
    capacity: dict[str, float] = {DEVICES: 0.0}
    for chip, health, schedulable in Device.objects.filter(node__removed_at__isnull=True).values_list(
        "chip_model", "health", "schedulable"
    ):
        chips.add(chip)
        if schedulable and health in Device.USABLE_HEALTH:
            capacity[DEVICES] += 1
            capacity[chip_resource(chip)] = capacity.get(chip_resource(chip), 0.0) + 1
    return chips, capacity


@transaction.atomic
def create_version(
    yaml_text: str, *, author: AbstractBaseUser | None, comment: str = "", activate: bool = True
) -> Policy:
    """Store a new version (validated first) and, by default, make it the active one.

    Raises :class:`PolicyError` with every issue when the text is invalid;
    nothing is stored then.
    """
    chips, _ = cluster_facts()
    parse_policy(yaml_text, chip_models=chips or None)
    # Lock the table's newest row so two admins applying at once get distinct versions.
    last = Policy.objects.select_for_update().aggregate(v=Max("version"))["v"] or 0
    record = Policy.objects.create(version=last + 1, yaml_text=yaml_text, author=author, comment=comment)
    if activate:
        activate_version(record.version, actor=author, comment=comment)
        record.refresh_from_db()
    return record


@transaction.atomic
def activate_version(version: int, *, actor: AbstractBaseUser | None = None, comment: str = "") -> Policy:
    """Make ``version`` the one active policy; the next tick uses it. Audited."""
    record = Policy.objects.select_for_update().get(version=version)
    parse_policy(record.yaml_text)
    previous = Policy.objects.filter(is_active=True).exclude(pk=record.pk).values_list("version", flat=True).first()
    Policy.objects.filter(is_active=True).exclude(pk=record.pk).update(is_active=False)
    record.is_active = True
    record.activated_at = timezone.now()
    record.save(update_fields=["is_active", "activated_at"])
    AuditEvent.objects.create(
        actor=actor,
        action="policy.activate",
        target=f"policy v{version}",
        detail=(f"replaces v{previous}" if previous else "first active policy") + (f": {comment}" if comment else ""),
    )
    log.info("policy v%s activated", version)
    return record
