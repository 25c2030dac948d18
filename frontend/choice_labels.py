"""Labels that other apps define (model choices) and the console shows, listed here so ``makemessages`` run
in ``frontend/`` puts them in the console's catalogue (``frontend/locale``, which LOCALE_PATHS serves to every
app). Nothing imports this module at run time."""

from django.utils.translation import gettext_noop as _

CHOICE_LABELS = [
    # scheduler.fleet.models.NodeStatus, DeviceHealth;
    # scheduler.models.JobState, JobKind, PriorityClass, TopologyConstraint
    _("ready"),
    _("not ready"),
    _("cordoned"),
    _("draining"),
    _("healthy"),
    _("degraded"),
    _("unhealthy"),
    _("submitted"),
    _("pending approval"),
    _("queued"),
    _("admitted"),
    _("running"),
    _("preempting"),
    _("succeeded"),
    _("failed"),
    _("cancelled"),
    _("node lost"),
    _("training"),
    _("inference"),
    _("interactive"),
    _("batch"),
    _("critical"),
    _("high"),
    _("normal"),
    _("low"),
    _("best effort"),
    _("simulated"),
    # tenants.models.PlatformRole, MembershipRole, TenantKind
    _("system admin"),
    _("security admin"),
    _("auditor"),
    _("tenant admin"),
    _("member"),
    _("viewer"),
    _("company"),
    _("department"),
    _("team"),
    _("project"),
    # tenants.models.ApprovalKind, ApprovalStatus, ApprovalStepRole, ApprovalDecision
    _("quota change"),
    _("job admission"),
    _("pending"),
    _("changes requested"),
    _("approved"),
    _("rejected"),
    _("expired"),
    _("tenant admin of the parent tenant"),
    _("approve"),
    _("reject"),
    _("request changes"),
    _("resubmit"),
    _("cancel"),
    _("expire"),
    # audit.models.Outcome
    _("success"),
    _("failure"),
    _("denied"),
    _("error"),
]
