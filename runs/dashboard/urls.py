from django.urls import path

from runs.dashboard import actions, schedules, threads, views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("runs/new/", views.submit_form, name="submit"),
    path("tenant/", views.switch_tenant, name="switch_tenant"),
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
    path(
        "runs/<uuid:run_id>/artifacts/<int:artifact_id>/", views.artifact_download, name="artifact"
    ),
    path("runs/<uuid:run_id>/cancel/", actions.cancel, name="cancel"),
    path("runs/<uuid:run_id>/pause/", actions.pause, name="pause"),
    path("runs/<uuid:run_id>/resume/", actions.resume, name="resume"),
    path("runs/<uuid:run_id>/retry/", actions.retry, name="retry"),
    path("runs/<uuid:run_id>/approve/", actions.approve, name="approve"),
    path("runs/<uuid:run_id>/reject/", actions.reject, name="reject"),
    path("runs/<uuid:run_id>/resolve/", actions.resolve, name="resolve"),
    path("runs/<uuid:run_id>/messages/", actions.post_message, name="message"),
    path(
        "runs/<uuid:run_id>/deliveries/<int:delivery_id>/redeliver/",
        actions.redeliver,
        name="redeliver",
    ),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path("schedules/<uuid:schedule_id>/toggle/", schedules.schedule_toggle, name="schedule_toggle"),
    path("threads/", threads.thread_list, name="threads"),
    path("threads/new/", threads.thread_new, name="thread_new"),
    path("threads/<uuid:thread_id>/", threads.thread_detail, name="thread"),
    path(
        "threads/<uuid:thread_id>/conversation/",
        threads.thread_conversation,
        name="thread_conversation",
    ),
    path("threads/<uuid:thread_id>/messages/", threads.thread_message, name="thread_message"),
    path("threads/<uuid:thread_id>/close/", threads.thread_close, name="thread_close"),
]
