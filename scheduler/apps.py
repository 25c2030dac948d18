from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Scheduling, nodes and devices"

    def ready(self) -> None:
        from audit.events import register_app_events
        from kernel.messages import labels_register, renderer_register
        from scheduler import (
            audit_events,
            message_text,
            messages,  # noqa: F401  (registers the scheduler's messages)
        )
        from scheduler.models import Job, JobKind, JobState
        from scheduler.services.jobs import job_reject_from_approval, job_release_from_approval
        from tenants.approval_handlers import ApprovalHandler, register_approval_handler

        register_app_events(self.label, audit_events.EVENTS)
        # A job's state and kind in a message read as their labels (kernel.messages renders them so).
        labels_register("state", lambda: {state.value: state.label for state in JobState})
        labels_register("to_state", lambda: {state.value: state.label for state in JobState})
        labels_register("job_kind", lambda: {kind.value: kind.label for kind in JobKind})
        # The engine's own sentences quoted in a message (why a job never fits, and the fix).
        renderer_register("sentences", message_text.localize)
        renderer_register("fix", message_text.localize)
        # Jobs waiting for admission are the scheduler's: it tells the tenants app's approval inbox what to do
        # with them when a request is decided (tenants never imports the scheduler).
        register_approval_handler(
            "job_admission",
            ApprovalHandler(
                approved=lambda approval, actor: job_release_from_approval(
                    job=Job.objects.get(pk=approval.job_id), actor=actor
                ),
                closed=lambda approval, actor, comment: job_reject_from_approval(
                    job=Job.objects.get(pk=approval.job_id), actor=actor, comment=comment
                ),
            ),
        )
