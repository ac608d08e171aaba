"""WSGI entry point for gunicorn."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "npuportal.settings")
application = get_wsgi_application()

# The web's first PDF statement would pay WeasyPrint's start-up; each worker pays it early, in the background.
from django.conf import settings  # noqa: E402 (after Django is set up)

if settings.PDF_WARMUP:
    from quotas.accounting.pdf_warmup import warm_up_in_background

    warm_up_in_background()
