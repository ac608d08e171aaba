from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    verbose_name = "Teams, quotas and policy"

    def ready(self) -> None:
        from axes.signals import user_locked_out

        from quotas.access.signin import record_lockout

        user_locked_out.connect(record_lockout, dispatch_uid="quotas.access.signin.record_lockout")
