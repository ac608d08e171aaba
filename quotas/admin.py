from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from quotas.access import signin
from quotas.models import ApiToken, AuditEvent, Department, Membership, Policy, Team, UserProfile, posix_account


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


class UserProfileInline(admin.StackedInline):
    """The POSIX account a user's jobs run as, edited with the user (docs/agent.md#accounts)."""

    model = UserProfile
    can_delete = False
    extra = 0
    max_num = 1
    verbose_name_plural = "POSIX account on the nodes"


class UserWithProfileAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, UserProfileInline]
    list_display = (*UserAdmin.list_display, "posix_account")
    list_select_related = ("profile",)

    @admin.display(description="POSIX account")
    def posix_account(self, obj: object) -> str:
        return posix_account(obj)


_User = get_user_model()
if admin.site.is_registered(_User):
    admin.site.unregister(_User)
admin.site.register(_User, UserWithProfileAdmin)


@admin.register(Department)
class DepartmentAdmin(admin.ModelAdmin):
    list_display = ("name", "description")
    search_fields = ("name",)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "department", "member_count", "created")
    list_filter = ("department",)
    search_fields = ("name", "description")
    inlines = [MembershipInline]

    @admin.display(description="members")
    def member_count(self, obj: Team) -> int:
        return obj.memberships.count()


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "team", "role")
    list_filter = ("role", "team")
    search_fields = ("user__username", "team__name")
    autocomplete_fields = ("user",)


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    """Read-only: versions change through the policy service, which validates and audits."""

    list_display = ("version", "is_active", "author", "comment", "created", "activated_at")
    list_filter = ("is_active",)
    search_fields = ("comment", "yaml_text")
    readonly_fields = ("version", "yaml_text", "is_active", "author", "comment", "created", "activated_at")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "target", "detail")
    list_filter = ("action",)
    search_fields = ("target", "detail", "actor__username")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


# -- sign-in locks (django-axes) -------------------------------------------------------------------


admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class UnlockingAccessAttemptAdmin(AccessAttemptAdmin):
    """Axes' list of failed sign-ins, with the two unlocks an admin needs, each audited.

    Unlocking by account and by address are separate on purpose: a victim's account
    hammered from an attacker's address can be opened without opening that address.
    """

    actions = ["unlock_accounts", "unlock_addresses", *AccessAttemptAdmin.actions]

    @admin.action(description="Unlock the accounts of the selected attempts (any address)")
    def unlock_accounts(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        names = sorted({u for u in queryset.values_list("username", flat=True) if u})
        count = signin.unlock_accounts(request.user, names)
        self.message_user(
            request, f"Unlocked {', '.join(names) or 'no account'}: cleared {count} record(s).", messages.SUCCESS
        )

    @admin.action(description="Unlock the addresses of the selected attempts (any account)")
    def unlock_addresses(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        addresses = sorted({a for a in queryset.values_list("ip_address", flat=True) if a})
        count = signin.unlock_addresses(request.user, addresses)
        self.message_user(
            request, f"Unlocked {', '.join(addresses) or 'no address'}: cleared {count} record(s).", messages.SUCCESS
        )


# -- usage accounting and chargeback (docs/chargeback.md) ---------------------------------------------

from quotas.models import (  # noqa: E402 - kept with the registrations they serve
    Budget,
    BudgetAlert,
    ClassMultiplier,
    Rate,
    RateCard,
    Statement,
    StatementLine,
    UsageRecord,
)


def _priced_a_closed_month(card: RateCard | None) -> bool:
    return card is not None and card.pk is not None and StatementLine.objects.filter(rate_card=card).exists()


class RateInline(admin.TabularInline):
    model = Rate
    extra = 1

    def has_change_permission(self, request, obj=None) -> bool:
        return not _priced_a_closed_month(obj)

    def has_add_permission(self, request, obj=None) -> bool:
        return not _priced_a_closed_month(obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return not _priced_a_closed_month(obj)


class ClassMultiplierInline(RateInline):
    model = ClassMultiplier


@admin.register(RateCard)
class RateCardAdmin(admin.ModelAdmin):
    """Editable until a closed month was priced with it; then read-only (add a new card instead)."""

    list_display = ("effective_from", "currency", "idle_mode", "reserved_mode", "comment", "created")
    list_filter = ("currency", "idle_mode", "reserved_mode")
    search_fields = ("comment",)
    inlines = [RateInline, ClassMultiplierInline]

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and not _priced_a_closed_month(obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and not _priced_a_closed_month(obj)


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ("team", "monthly_amount", "alert_thresholds")
    search_fields = ("team__name",)


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(BudgetAlert)
class BudgetAlertAdmin(_ReadOnly):
    list_display = ("team", "month", "threshold", "amount", "sent_at")
    list_filter = ("month", "threshold")
    search_fields = ("team__name",)


@admin.register(UsageRecord)
class UsageRecordAdmin(_ReadOnly):
    list_display = (
        "month",
        "team",
        "user",
        "job",
        "chip_model",
        "vnpu_template",
        "device_share",
        "priority_class",
        "start",
        "end",
    )
    list_filter = ("month", "chip_model", "priority_class")
    search_fields = ("team__name", "user__username", "allocation_id")
    list_select_related = ("team", "user", "job")
    show_full_result_count = False


class StatementLineInline(admin.TabularInline):
    model = StatementLine
    extra = 0
    fields = (
        "kind",
        "chip_model",
        "vnpu_template",
        "priority_class",
        "device_hours",
        "rate",
        "multiplier",
        "amount",
        "description",
        "actor",
    )
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Statement)
class StatementAdmin(_ReadOnly):
    """Frozen at the close: corrections are adjustment lines (``manage.py chargeback adjust``)."""

    list_display = ("month", "team", "total", "currency", "idle_mode", "reserved_mode", "closed_at")
    list_filter = ("month", "currency")
    search_fields = ("team__name",)
    inlines = [StatementLineInline]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_staff


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Admins may see and revoke tokens; keys are never stored, so never shown."""

    list_display = ("name", "user", "prefix", "created", "last_used")
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("user", "name", "key_hash", "prefix", "created", "last_used")
    exclude = ()

    def has_add_permission(self, request) -> bool:
        return False
