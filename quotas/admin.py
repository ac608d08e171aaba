from django.contrib import admin

from quotas.models import ApiToken, AuditEvent, Department, Membership, Policy, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Admins may see and revoke tokens; keys are never stored, so never shown."""

    list_display = ("name", "user", "prefix", "created", "last_used")
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("user", "name", "key_hash", "prefix", "created", "last_used")
    exclude = ()

    def has_add_permission(self, request) -> bool:
        return False
