"""API routes of usage reports (mounted at ``/api/v1/reports/``, before the rest of the API)."""

from django.urls import path

from quotas.api.reports import StatementDetailView, StatementListView

urlpatterns = [
    path("statements/", StatementListView.as_view(), name="api-report-statements"),
    path("statements/<str:team>/<str:month>/", StatementDetailView.as_view(), name="api-report-statement"),
]
