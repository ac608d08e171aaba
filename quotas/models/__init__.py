"""The quotas app's models, declared by domain and imported from here: ``from quotas.models import Team``.

Every model keeps the app label ``quotas`` and its table (``quotas_team``, ...): the package only says
which domain each belongs to, so no migration moves a table.

- :mod:`.tenancy`: departments, teams, memberships (roles), user profiles
- :mod:`.policies`: policy versions
- :mod:`.access`: API tokens, the audit log
- :mod:`.accounting`: usage records, rate cards, budgets, statements
- :mod:`.requests`: quota change requests
"""

from quotas.models.access import ApiToken, AuditEvent
from quotas.models.accounting import (
    Budget,
    BudgetAlert,
    ClassMultiplier,
    ClosedStatementError,
    Rate,
    RateCard,
    Statement,
    StatementLine,
    StatementLineQuerySet,
    StatementQuerySet,
    UsageRecord,
)
from quotas.models.policies import Policy
from quotas.models.requests import QuotaRequest
from quotas.models.tenancy import POSIX_NAME_PATTERN, Department, Membership, Team, UserProfile, posix_account

__all__ = [
    "POSIX_NAME_PATTERN",
    "ApiToken",
    "AuditEvent",
    "Budget",
    "BudgetAlert",
    "ClassMultiplier",
    "ClosedStatementError",
    "Department",
    "Membership",
    "Policy",
    "QuotaRequest",
    "Rate",
    "RateCard",
    "Statement",
    "StatementLine",
    "StatementLineQuerySet",
    "StatementQuerySet",
    "Team",
    "UsageRecord",
    "UserProfile",
    "posix_account",
]
