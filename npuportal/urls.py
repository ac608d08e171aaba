from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from npuportal.api import error_handling
from npuportal.health import healthz
from npuportal.metrics import metrics
from quotas.access import signin
from quotas.access import views as access_console
from quotas.directory import oidc
from quotas.policies import request_views as quota_requests
from quotas.policies import views as policy_console
from quotas.tenancy import views as team_console
from scheduling import views as console

urlpatterns = [
    path("", console.dashboard, name="dashboard"),
    path("jobs/", console.job_list, name="console-job-list"),
    path("jobs/new/", console.job_submit, name="console-job-submit"),
    path("jobs/<int:pk>/", console.job_detail, name="console-job-detail"),
    path("jobs/<int:pk>/cancel/", console.job_cancel, name="console-job-cancel"),
    path("jobs/<int:pk>/resubmit/", console.job_resubmit, name="console-job-resubmit"),
    path("nodes/<str:name>/", console.node_detail, name="console-node-detail"),
    path("nodes/<str:name>/<str:action>/", console.node_action, name="console-node-action"),
    path("audit/", console.audit_log, name="console-audit-log"),
    path("cluster/", console.cluster, name="cluster"),
    # Live regions of the pages above, polled by htmx (templates/live/).
    path("live/dashboard/", console.dashboard_live, name="live-dashboard"),
    path("live/jobs/", console.job_list_live, name="live-job-list"),
    path("live/jobs/<int:pk>/", console.job_detail_live, name="live-job-detail"),
    path("live/cluster/", console.cluster_live, name="live-cluster"),
    path("live/nodes/<str:name>/", console.node_detail_live, name="live-node-detail"),
    path("quota/", policy_console.team_quota, name="console-team-quota"),
    path("quota/requests/", quota_requests.request_list, name="console-quota-requests"),
    path("quota/requests/<int:pk>/", quota_requests.request_detail, name="console-quota-request"),
    path("team/", team_console.my_team, name="console-my-team"),
    path("team/<slug:name>/", team_console.team_members, name="console-team-members"),
    path("invite/<str:secret>/", team_console.invitation, name="team-invitation"),
    path("tokens/", access_console.api_tokens, name="console-api-tokens"),
    path("teams/", policy_console.team_list, name="console-teams"),
    path("teams/<slug:name>/", policy_console.team_edit, name="console-team-edit"),
    path("policy/", policy_console.policy_editor, name="console-policy-editor"),
    path("policy/history/", policy_console.policy_history, name="console-policy-history"),
    path("policy/v<int:version>/", policy_console.policy_version, name="console-policy-version"),
    path("policy/v<int:version>/restore/", policy_console.policy_restore, name="console-policy-restore"),
    path("login/", signin.ConsoleLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Single sign-on (OIDC), answering 404 unless NPUPORTAL_OIDC_ISSUER is set (quotas.directory.oidc).
    path("oidc/authenticate/", oidc.DirectoryOIDCRequestView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", oidc.DirectoryOIDCCallbackView.as_view(), name="oidc_authentication_callback"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("reports/", include("quotas.accounting.urls")),
    path("api/v1/reports/", include("quotas.api.report_urls")),
    path("api/v1/", include("npuportal.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
]

# Under /api/ these answer the API's JSON error shape; elsewhere Django's pages (or our templates).
handler400 = error_handling.bad_request
handler403 = error_handling.permission_denied
handler404 = error_handling.page_not_found
handler500 = error_handling.server_error
