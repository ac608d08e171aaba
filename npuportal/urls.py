from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from npuportal.health import healthz
from scheduling import views as console

urlpatterns = [
    path("", console.dashboard, name="dashboard"),
    path("jobs/", console.job_list, name="job-list"),
    path("jobs/<int:pk>/", console.job_detail, name="job-detail"),
    path("cluster/", console.cluster, name="cluster"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("scheduling.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
