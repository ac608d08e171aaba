"""npuportal: a policy-as-config scheduler for shared accelerator clusters."""

from npuportal.celery import app as celery_app

__all__ = ["celery_app"]
