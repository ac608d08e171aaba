"""Usage accounting and monthly chargeback (docs/chargeback.md).

``records`` writes usage records, ``rates`` prices and rounds, ``statements``
closes months, adjusts statements and checks budgets, ``reports`` aggregates the
reports page, ``exports`` writes CSV, JSON and PDF; ``demo`` seeds the demo's.
``views`` and ``urls`` are the console's ``/reports/`` pages, ``tasks`` the Celery
shells the beat runs (``quotas.record_usage``, ``quotas.close_month``).
"""
