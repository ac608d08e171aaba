"""Console routes of usage reports and chargeback (mounted at ``/reports/``)."""

from django.urls import path

from quotas.accounting import views as report_views

urlpatterns = [
    path("", report_views.reports_index, name="reports"),
    path("<str:month>/all-teams.csv", report_views.month_csv, name="reports-month-csv"),
    path("<str:month>/jobs.csv", report_views.jobs_csv, name="reports-jobs-csv"),
    path("<str:month>/team/<str:team>.csv", report_views.team_csv, name="reports-team-csv"),
    path("rates/", report_views.rate_cards, name="reports-rates"),
    path("statements/", report_views.statements_latest, name="reports-statements"),
    path("statement/<str:team>/<str:month>.csv", report_views.statement_csv, name="reports-statement-csv"),
    path("statement/<str:team>/<str:month>.pdf", report_views.statement_pdf, name="reports-statement-pdf"),
    path("statement/<str:team>/<str:month>/", report_views.statement_page, name="reports-statement"),
]
