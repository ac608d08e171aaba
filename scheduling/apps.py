from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self) -> None:
        """Keep the output of runs an executor saw end (``devices.executors.base.runs_ended``)."""
        from devices.executors.base import on_runs_ended
        from scheduling.services.output import keep_outputs

        on_runs_ended(keep_outputs)
