"""Tenants (a tree: company → department → team), users with platform roles, and memberships."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils.translation import gettext_lazy as _

MAX_TENANT_DEPTH = 4


class PlatformRole(models.TextChoices):
    """Platform roles with separation of duties (三权分立): one account holds at most one of them.

    Holding a single field (not a many-to-many) makes "two platform roles" unrepresentable in the database.
    """

    NONE = "", _("none")
    SYSTEM_ADMIN = "system_admin", _("system admin")
    SECURITY_ADMIN = "security_admin", _("security admin")
    AUDITOR = "auditor", _("auditor")


class User(AbstractUser):
    platform_role = models.CharField(max_length=32, choices=PlatformRole.choices, default=PlatformRole.NONE, blank=True)
    # The language the console last showed this person (its language menu) and their e-mails are written in;
    # "" = the platform's (LANGUAGE_CODE).
    language = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(platform_role__in=[choice.value for choice in PlatformRole]),
                name="user_platform_role_valid",
            ),
        ]


class TenantKind(models.TextChoices):
    COMPANY = "company", _("company")
    DEPARTMENT = "department", _("department")
    TEAM = "team", _("team")
    PROJECT = "project", _("project")


class Tenant(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=TenantKind.choices, default=TenantKind.TEAM)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    # 1 for a root; kept in the row so subtree and depth checks need no recursive query.
    depth = models.PositiveSmallIntegerField(default=1)
    description = models.TextField(blank=True, default="")
    # Jobs asking for more than this many millis in total wait for approval; None = the
    # GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS setting (unset there: only priority "critical" waits).
    job_approval_threshold_millis = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["parent", "name"], name="tenant_name_unique_among_siblings"),
            models.CheckConstraint(
                condition=models.Q(depth__gte=1, depth__lte=MAX_TENANT_DEPTH), name="tenant_depth_in_range"
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class MembershipRole(models.TextChoices):
    TENANT_ADMIN = "tenant_admin", _("tenant admin")
    MEMBER = "member", _("member")
    VIEWER = "viewer", _("viewer")


class Membership(models.Model):
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=MembershipRole.choices, default=MembershipRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class TokenScope(models.TextChoices):
    """What an API token may do: ``read`` = safe methods only, ``write`` = changes too, ``admin`` = also the
    platform operations the access policy marks ``admin`` (``kernel.access_rules.TOKEN_SCOPE``: accounts, roles, quotas,
    nodes)."""

    READ = "read", _("read")
    WRITE = "write", _("write")
    ADMIN = "admin", _("admin")


TOKEN_PREFIX = "gp_"


class ApiToken(models.Model):
    """A personal API token. Only ``key_prefix`` (for lookup and display) and the SHA-256 of the whole token
    are stored; the secret is shown once when the token is created."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_prefix = models.CharField(max_length=16, unique=True)
    key_sha256 = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.READ)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="apitoken_name_unique_per_user")]

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.key_prefix}…)"


# --- quotas, approvals, notifications, prices -------------------------------------------------------------

# Quotas are set in tenths of a card: 1000 millis = one card.
QUOTA_STEP_MILLIS = 100


class Quota(models.Model):
    """What a tenant is promised (and may at most use) of one flavor. Usage rolls up the tree: a parent's
    quota covers its whole subtree, and Σ children's guaranteed ≤ the parent's guaranteed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="quotas")
    flavor = models.ForeignKey("catalog.ResourceFlavor", on_delete=models.PROTECT, related_name="quotas")
    guaranteed_millis = models.PositiveIntegerField(default=0)
    # None = no limit beyond what can be borrowed from the cohort.
    limit_millis = models.PositiveIntegerField(null=True, blank=True)
    # None = all idle guarantee may be lent to siblings.
    lending_limit_millis = models.PositiveIntegerField(null=True, blank=True)
    guaranteed_memory_mib = models.PositiveBigIntegerField(default=0)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "flavor__name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "flavor"], name="quota_unique_tenant_flavor"),
            models.CheckConstraint(
                condition=models.Q(limit_millis__isnull=True)
                | models.Q(limit_millis__gte=models.F("guaranteed_millis")),
                name="quota_limit_at_least_guaranteed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.flavor.name}"

    def values(self) -> dict:
        return {field: getattr(self, field) for field in QUOTA_FIELDS}


QUOTA_FIELDS = (
    "guaranteed_millis",
    "limit_millis",
    "lending_limit_millis",
    "guaranteed_memory_mib",
    "max_running_jobs",
)


class ApprovalKind(models.TextChoices):
    QUOTA_CHANGE = "quota_change", _("quota change")
    JOB_ADMISSION = "job_admission", _("job admission")


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    CHANGES_REQUESTED = "changes_requested", _("changes requested")
    APPROVED = "approved", _("approved")
    REJECTED = "rejected", _("rejected")
    EXPIRED = "expired", _("expired")
    CANCELLED = "cancelled", _("cancelled")
    # Approved by everyone, but the change no longer fit when it was applied.
    FAILED = "failed", _("failed")


OPEN_APPROVAL_STATUSES = (ApprovalStatus.PENDING, ApprovalStatus.CHANGES_REQUESTED)


class ApprovalStepRole(models.TextChoices):
    TENANT_ADMIN = "tenant_admin", _("tenant admin")
    PARENT_TENANT_ADMIN = "parent_tenant_admin", _("tenant admin of the parent tenant")
    SYSTEM_ADMIN = "system_admin", _("system admin")


class ApprovalRequest(models.Model):
    """One item of the approval inbox: a quota change or a job waiting for admission.

    ``chain`` is the list of approver roles (from ``GPUPOOL_APPROVAL_CHAINS``) fixed when the request was made;
    ``step`` is the index of the role whose decision is awaited.
    """

    kind = models.CharField(max_length=16, choices=ApprovalKind.choices)
    status = models.CharField(
        max_length=20, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING, db_index=True
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="approval_requests")
    requester = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    flavor = models.ForeignKey("catalog.ResourceFlavor", null=True, blank=True, on_delete=models.PROTECT)
    # The scheduler's job waiting for admission, by id: the tenants app sits below the scheduler and names none of
    # its tables (the scheduler resolves the id when the request is decided; a job is never deleted on its own,
    # only with its tenant, which takes its requests along).
    job_id = models.BigIntegerField(null=True, blank=True, db_index=True, db_column="job_id")
    # quota_change: the requested values (QUOTA_FIELDS); job_admission: a summary of the job.
    payload = models.JSONField(default=dict)
    reason = models.TextField(blank=True, default="")
    chain = models.JSONField(default=list)
    step = models.PositiveSmallIntegerField(default=0)
    # Steps of the configured chain that were passed over because nobody but the requester could decide
    # them: [{"role": ..., "reason": ...}] (the request went to the next step, or to the system admins).
    escalations = models.JSONField(default=list, blank=True)
    result_message = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(db_index=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"

    @property
    def awaiting_role(self) -> str | None:
        if self.status != ApprovalStatus.PENDING or self.step >= len(self.chain):
            return None
        return self.chain[self.step]


class ApprovalDecision(models.TextChoices):
    APPROVE = "approve", _("approve")
    REJECT = "reject", _("reject")
    REQUEST_CHANGES = "request_changes", _("request changes")
    RESUBMIT = "resubmit", _("resubmit")
    CANCEL = "cancel", _("cancel")
    EXPIRE = "expire", _("expire")


class ApprovalStep(models.Model):
    """One decision on a request (its history)."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="steps")
    step = models.PositiveSmallIntegerField()
    role = models.CharField(max_length=32, blank=True, default="")
    actor = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    decision = models.CharField(max_length=20, choices=ApprovalDecision.choices)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SENT = "sent", _("sent")
    RETRYING = "retrying", _("retrying")
    FAILED = "failed", _("failed")


class NotificationDelivery(models.Model):
    """One message to one channel (e-mail, webhook, chat robot); retried with backoff, visible to admins."""

    approval = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=64)
    notifier = models.CharField(max_length=200, help_text="dotted path of the notifier class")
    recipients = models.JSONField(default=list, blank=True)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class TenantStorageUsage(models.Model):
    """What a tenant's part of the shared storage holds (``GPUPOOL_SHARED_STORAGE``), as last measured by the
    worker (``scheduler.tasks.shared_storage_measure``); shown beside its quotas."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="storage_usage", primary_key=True)
    used_bytes = models.PositiveBigIntegerField(default=0)
    files = models.PositiveBigIntegerField(default=0)
    measured_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.used_bytes} bytes"
