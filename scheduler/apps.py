from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Scheduling, nodes and devices"

    def ready(self) -> None:
        from audit.events import register_app_events
        from scheduler import audit_events
        from scheduler.models import Job
        from scheduler.services.jobs import job_reject_from_approval, job_release_from_approval
        from tenants.approval_handlers import ApprovalHandler, register_approval_handler

        register_app_events(self.label, audit_events.EVENTS)
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
