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
    platform operations that views mark ``required_scope = "admin"`` (users, roles, approvals)."""

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
