"""Settings for the test run: the real settings, with test-only speed-ups.

The database and broker still come from DATABASE_URL and REDIS_URL, so the
same suite runs on SQLite locally and on PostgreSQL + Redis in CI.
"""

import os

os.environ.setdefault("NPUPORTAL_VAR_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), "var", "test"))

from npuportal.settings import *  # noqa: F403
from npuportal.settings import DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so tests that run two processes or threads share one database.
    # One file per test run (by process id), so parallel runs on one machine never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}  # noqa: F405
AGENT_TIMEOUT_S = 2.0
AGENT_MISSED_POLLS = 2
AGENT_REJOIN_POLLS = 2
HEALTH_REJOIN_POLLS = 2
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 - whitenoise warns when it is missing
