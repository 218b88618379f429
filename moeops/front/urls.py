from django.urls import path

from moeops.front import views

urlpatterns = [
    path("", views.deployments, name="deployments"),
    path("deployments/<int:pk>/", views.deployment_detail, name="deployment-detail"),
]
