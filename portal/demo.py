"""Demo data and demo processes for ``gpupool demo``. Everything is created through services."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from django.db import transaction

DEMO_PASSWORD = "gpupool-demo-2026"


@dataclass(frozen=True)
class DemoLogin:
    username: str
    role: str


DEMO_LOGINS = [
    DemoLogin("admin", "system admin"),
    DemoLogin("security", "security admin"),
    DemoLogin("auditor", "auditor"),
    DemoLogin("alice", "tenant admin of acme/research"),
    DemoLogin("bob", "member of acme/research/vision"),
    DemoLogin("carol", "member of acme/research/nlp"),
]


@transaction.atomic
def load_demo_data() -> bool:
    """Create the demo tenants, users and flavors. Idempotent: returns False when they already exist."""
    from scheduler.models import ResourceFlavor, Vendor
    from tenants.models import MembershipRole, PlatformRole, TenantKind, User
    from tenants.services import membership_create, tenant_create, user_create

    if User.objects.filter(username="admin").exists():
        return False
    users = {
        "admin": user_create(
            actor=None, username="admin", password=DEMO_PASSWORD, platform_role=PlatformRole.SYSTEM_ADMIN
        ),
        "security": user_create(
            actor=None, username="security", password=DEMO_PASSWORD, platform_role=PlatformRole.SECURITY_ADMIN
        ),
        "auditor": user_create(
            actor=None, username="auditor", password=DEMO_PASSWORD, platform_role=PlatformRole.AUDITOR
        ),
        "alice": user_create(actor=None, username="alice", password=DEMO_PASSWORD),
        "bob": user_create(actor=None, username="bob", password=DEMO_PASSWORD),
        "carol": user_create(actor=None, username="carol", password=DEMO_PASSWORD),
    }
    acme = tenant_create(actor=None, name="ACME", slug="acme", kind=TenantKind.COMPANY)
    research = tenant_create(actor=None, name="Research", slug="acme-research", kind=TenantKind.DEPARTMENT, parent=acme)
    vision = tenant_create(actor=None, name="Vision", slug="acme-vision", kind=TenantKind.TEAM, parent=research)
    nlp = tenant_create(actor=None, name="NLP", slug="acme-nlp", kind=TenantKind.TEAM, parent=research)
    membership_create(actor=None, user=users["alice"], tenant=research, role=MembershipRole.TENANT_ADMIN)
    membership_create(actor=None, user=users["bob"], tenant=vision, role=MembershipRole.MEMBER)
    membership_create(actor=None, user=users["carol"], tenant=nlp, role=MembershipRole.MEMBER)
    for name, vendor, model, memory_mib in [
        ("nvidia-h100-80g", Vendor.NVIDIA, "NVIDIA H100 80GB HBM3", 81559),
        ("nvidia-a100-40g", Vendor.NVIDIA, "NVIDIA A100-SXM4-40GB", 40960),
        ("ascend-910b", Vendor.ASCEND, "Ascend 910B", 65536),
    ]:
        ResourceFlavor.objects.get_or_create(
            name=name, defaults={"vendor": vendor, "model": model, "memory_mib": memory_mib}
        )
    # Quotas (millis; 1000 = one card), so demo jobs can run: the company holds the pool, research part of it,
    # and each team a guarantee it may exceed by borrowing its sibling's idle share.
    from tenants.services import quota_set

    for tenant, flavor, guaranteed, limit in [
        (acme, "nvidia-h100-80g", 16000, 16000),
        (acme, "nvidia-a100-40g", 4000, 4000),
        (acme, "ascend-910b", 8000, 8000),
        (research, "nvidia-h100-80g", 12000, 16000),
        (research, "nvidia-a100-40g", 4000, 4000),
        (research, "ascend-910b", 8000, 8000),
        (vision, "nvidia-h100-80g", 4000, 8000),
        (nlp, "nvidia-h100-80g", 4000, 8000),
        (vision, "nvidia-a100-40g", 2000, 4000),
        (nlp, "nvidia-a100-40g", 2000, 4000),
    ]:
        quota_set(
            actor=None,
            tenant=tenant,
            flavor=ResourceFlavor.objects.get(name=flavor),
            values={"guaranteed_millis": guaranteed, "limit_millis": limit},
        )
    return True


def start_demo_agents(*, server_url: str, count: int) -> list[subprocess.Popen]:
    """Start ``count`` simulated node agents as child processes connected to ``server_url``.

    Each gets a fresh one-time bootstrap token (written 0600 to its token file), so it registers as
    ``sim-NN`` whatever state an earlier run left behind; re-registering replaces the node's old credential.
    Returns the processes so the caller can stop them.
    """
    processes: list[subprocess.Popen] = []
    if count <= 0:
        return processes
    try:
        from nodeagent import demo as agent_demo
    except ImportError:
        return processes
    from django.conf import settings

    from scheduler.fleet.services import bootstrap_token_create

    for index in range(count):
        paths = agent_demo.demo_agent_paths(index=index, data_dir=settings.DATA_DIR)
        _token, secret = bootstrap_token_create(actor=None, ttl_s=600, description=f"gpupool demo: {paths.node_name}")
        agent_demo.write_bootstrap_token(paths.token_file, secret)
        command = agent_demo.demo_agent_command(
            python=sys.executable, server_url=server_url, index=index, data_dir=settings.DATA_DIR
        )
        processes.append(
            subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL)
        )
    return processes
