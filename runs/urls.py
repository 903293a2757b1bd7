from django.urls import path

from runs import views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
]
