from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"
    verbose_name = "Nodes and devices"

    def ready(self) -> None:
        from devices import checks  # noqa: F401  (registers the system checks)
