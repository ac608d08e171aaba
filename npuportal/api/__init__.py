"""What every app's REST API shares: the error shape, authentication, permissions, throttles, pagination.

The apps' own endpoints live in ``<app>/api/``; this package is the plumbing under all of them, named in
``settings.REST_FRAMEWORK`` and ``SPECTACULAR_SETTINGS``, and the ``/api/v1/`` router (:mod:`.urls`).
"""
