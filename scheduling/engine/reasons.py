"""Why a job is waiting, and why a running job is asked to leave.

The codes follow Slurm's ``squeue`` reason names where Slurm has one, so users
who know Slurm read them without a glossary; each has one plain sentence that
the console and ``explain`` show next to it. A code is a string rather than an
enum because it is stored in the database and sent over the API as text.
"""

from __future__ import annotations

from typing import Final

# -- waiting reasons, roughly in the order the pipeline can produce them ------
DEPENDENCY: Final = "Dependency"
JOB_ARRAY_TASK_LIMIT: Final = "JobArrayTaskLimit"
MEMBER_LIMIT: Final = "MemberLimit"
QUOTA_CLASS_NOT_ALLOWED: Final = "QuotaClassNotAllowed"
QUOTA_MAX_DURATION: Final = "QuotaMaxDuration"
MONTHLY_BUDGET_EXHAUSTED: Final = "MonthlyBudgetExhausted"
QUOTA_MAX_JOBS: Final = "QuotaMaxJobs"
QUOTA_MAX_DEVICES: Final = "QuotaMaxDevices"
RESERVED_CAPACITY: Final = "ReservedCapacity"
CHIP_MODEL_UNAVAILABLE: Final = "ChipModelUnavailable"
NODE_UNHEALTHY: Final = "NodeUnhealthy"
TOPOLOGY: Final = "Topology"
PREEMPTION_GRACE: Final = "PreemptionGrace"
RESOURCES: Final = "Resources"
PRIORITY: Final = "Priority"
NEVER_RUNNABLE: Final = "NeverRunnable"

# -- why a waiting job is cancelled (``Decisions.cancelled``) -------------------
DEPENDENCY_NEVER_SATISFIED: Final = "DependencyNeverSatisfied"

# -- preemption reasons (``Preemption.reason``) --------------------------------
GUARANTEE_RECLAIM: Final = "GuaranteeReclaim"
CLASS_PREEMPTION: Final = "ClassPreemption"

#: One plain sentence per code, for people who do not know Slurm: the one table of these words. The
#: console (``scheduling.reason_text.reason_text``), the API's ``pending_reason_text``, ``explain`` and
#: ``manage.py sprio`` all read it, so a waiting job reads the same everywhere.
TEXT: Final[dict[str, str]] = {
    DEPENDENCY: "It waits for the jobs it depends on to end as it asked (afterok, afterany, afternotok).",
    JOB_ARRAY_TASK_LIMIT: "Its array already runs as many copies at once as the array's limit (%N) allows.",
    MEMBER_LIMIT: "Your team lead limits how many cards or jobs you run at once, and yours already use it.",
    DEPENDENCY_NEVER_SATISFIED: "A job it depended on ended in a way its dependency can never accept, so it was "
    "cancelled.",
    QUOTA_CLASS_NOT_ALLOWED: "Your team's quota does not allow this priority class.",
    QUOTA_MAX_DURATION: "The job asks for more run time than your team's limit on run time.",
    MONTHLY_BUDGET_EXHAUSTED: "Your team's device-hours for this month would be used up by this job.",
    QUOTA_MAX_JOBS: "Your team already runs as many jobs at once as its quota allows.",
    QUOTA_MAX_DEVICES: "Starting the job would take your team above its maximum number of devices.",
    RESERVED_CAPACITY: "The free devices are held back for other priority classes by a reservation.",
    CHIP_MODEL_UNAVAILABLE: "The cluster has no device of the requested chip model or vNPU shape.",
    NODE_UNHEALTHY: "Devices of the requested kind exist, but too few are healthy and schedulable.",
    TOPOLOGY: "The request does not fit the servers' shape (cards per node or per HCCS ring).",
    PREEMPTION_GRACE: "Running jobs are leaving to make room for this job; it starts when their grace ends.",
    RESOURCES: "Not enough free devices of the kind it needs right now.",
    PRIORITY: "Jobs with a higher priority are waiting for the same devices and go first.",
    NEVER_RUNNABLE: "The job can never run under the current policy and cluster; cancel it or ask an admin.",
    GUARANTEE_RECLAIM: "Your team was borrowing devices guaranteed to another team, which needs them back.",
    CLASS_PREEMPTION: "A job of a higher priority class that may preempt yours needs the devices.",
}

#: Waiting reasons that come from the team's own limits: such a job holds no
#: place in the queue and never blocks the jobs behind it.
QUOTA_REASONS: Final = frozenset(
    {
        MEMBER_LIMIT,
        QUOTA_CLASS_NOT_ALLOWED,
        QUOTA_MAX_DURATION,
        MONTHLY_BUDGET_EXHAUSTED,
        QUOTA_MAX_JOBS,
        QUOTA_MAX_DEVICES,
    }
)


def describe(code: str) -> str:
    """The plain-words text of ``code`` (the code itself if it is unknown)."""
    return TEXT.get(code, code)
