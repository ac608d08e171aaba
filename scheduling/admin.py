from django.contrib import admin

from scheduling.models import Allocation, Job, JobEvent, JobPromise, TickRecord


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    readonly_fields = ("device", "vnpu_template", "device_share", "start", "end")


class JobEventInline(admin.TabularInline):
    model = JobEvent
    fk_name = "job"
    extra = 0
    can_delete = False
    readonly_fields = (
        "recorded_at",
        "at",
        "reported_at",
        "from_state",
        "to_state",
        "reason",
        "detail",
        "other_job",
        "actor",
        "policy_version",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "team",
        "submitter",
        "priority_class",
        "num_devices",
        "vnpu_template",
        "state",
        "pending_reason",
        "submitted_at",
        "started_at",
    )
    list_filter = ("state", "priority_class", "team", "chip_model")
    search_fields = ("name", "command", "submitter__username", "team__name")
    list_select_related = ("team", "submitter", "vnpu_template")
    date_hierarchy = "submitted_at"
    readonly_fields = (
        "state",
        "started_at",
        "ended_at",
        "pending_reason",
        "pending_detail",
        "estimated_start",
        "preempt_deadline",
        "exit_code",
        "retries",
        "launched",
    )
    inlines = [AllocationInline, JobEventInline]

    def get_changeform_initial_data(self, request):
        from django.utils import timezone

        return {"submitted_at": timezone.now(), "submitter": request.user.pk, "priority_class": "normal"}

    def save_model(self, request, obj, form, change) -> None:
        """Jobs added here go through the same submission path as the API's."""
        if change:
            super().save_model(request, obj, form, change)
            return
        from scheduling.services.jobs import record_submission

        super().save_model(request, obj, form, change)
        record_submission(obj, actor=request.user)


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("job", "device", "vnpu_template", "device_share", "start", "end")
    list_filter = ("device__chip_model", "device__node")
    search_fields = ("job__name", "device__node__name")
    list_select_related = ("job", "device__node", "vnpu_template")


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = (
        "job",
        "recorded_at",
        "at",
        "from_state",
        "to_state",
        "reason",
        "other_job",
        "actor",
        "policy_version",
    )
    list_filter = ("to_state", "reason")
    search_fields = ("job__name", "detail")
    list_select_related = ("job", "actor", "other_job")

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(JobPromise)
class JobPromiseAdmin(admin.ModelAdmin):
    """Read-only: the tick writes promises and ends them; an edit here would only confuse it."""

    list_display = ("job", "until", "devices")
    list_select_related = ("job",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(TickRecord)
class TickRecordAdmin(admin.ModelAdmin):
    list_display = (
        "started_at",
        "duration_ms",
        "decide_ms",
        "policy_version",
        "pending",
        "running",
        "starts",
        "preemptions",
    )
    list_filter = ("policy_version",)
