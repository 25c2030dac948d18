"""Demo data and demo processes for ``gpupool demo``. Everything is created through services."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction

from catalog.models import ResourceFlavor
from nodeagent import demo as agent_demo
from portal import demo_history
from portal.demo_login import DEMO_PASSWORD
from portal.demo_nodes import DemoNodeRow
from scheduler.fleet.services.enrolment import agent_register, bootstrap_token_create
from scheduler.fleet.services.inventory import node_hello
from tenants.models import MembershipRole, PlatformRole, Tenant, TenantKind, User
from tenants.services.identity import user_create
from tenants.services.memberships import membership_create
from tenants.services.quotas import quota_set
from tenants.services.tenancy import tenant_create


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


#: The demo's quotas (millis; 1000 = one card) on its fleet of 8 H100, 4 A100 and 8 Ascend 910B cards
#: (``nodeagent.demo.DEMO_NODES``): the company is guaranteed exactly the pool, research all of it, and each team
#: a guarantee it may exceed by borrowing what its sibling and the department leave idle. No guarantee is a
#: promise the pool cannot keep (``frontend.summaries.guarantee_overcommit`` stays empty).
DEMO_QUOTAS: list[tuple[str, str, int, int]] = [
    ("acme", "nvidia-h100-80g", 8000, 8000),
    ("acme", "nvidia-a100-40g", 4000, 4000),
    ("acme", "ascend-910b", 8000, 8000),
    ("acme-research", "nvidia-h100-80g", 8000, 8000),
    ("acme-research", "nvidia-a100-40g", 4000, 4000),
    ("acme-research", "ascend-910b", 8000, 8000),
    ("acme-vision", "nvidia-h100-80g", 3000, 8000),
    ("acme-nlp", "nvidia-h100-80g", 3000, 8000),
    ("acme-vision", "nvidia-a100-40g", 1000, 4000),
    ("acme-nlp", "nvidia-a100-40g", 1000, 4000),
    ("acme-nlp", "ascend-910b", 2000, 8000),
]

DEMO_FLAVORS = [
    ("nvidia-h100-80g", "nvidia", "NVIDIA H100 80GB HBM3", 81559),
    ("nvidia-a100-40g", "nvidia", "NVIDIA A100-SXM4-40GB", 40960),
    ("ascend-910b", "ascend", "Ascend 910B", 65536),
]


@transaction.atomic
def load_demo_data(*, agents: int | None = None, now: datetime | None = None) -> bool:
    """Create the demo tenants, users, flavors and quotas, register the nodes of the first ``agents`` demo agents
    (``GPUPOOL_DEMO_AGENTS`` by default) with the cards they will report, and give the pool its last hour
    (``portal.demo_history``): finished jobs, per-minute telemetry, quota approvals, and two jobs that the live
    agents then run. Idempotent: returns False when the demo data already exist."""

    if User.objects.filter(username="admin").exists():
        return False
    agents = settings.GPUPOOL_DEMO_AGENTS if agents is None else agents
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
    for name, vendor, model, memory_mib in DEMO_FLAVORS:
        ResourceFlavor.objects.get_or_create(
            name=name, defaults={"vendor": vendor, "model": model, "memory_mib": memory_mib}
        )
    for slug, flavor, guaranteed, limit in DEMO_QUOTAS:
        quota_set(
            actor=None,
            tenant=Tenant.objects.get(slug=slug),
            flavor=ResourceFlavor.objects.get(name=flavor),
            values={"guaranteed_millis": guaranteed, "limit_millis": limit},
        )
    nodes = register_demo_nodes(count=agents)
    demo_history.load_history(nodes=nodes, now=now)
    return True


def register_demo_nodes(*, count: int) -> list[DemoNodeRow]:
    """Register demo nodes ``sim-00`` … and apply the hello their agents will send, so the nodes and their cards
    exist (ready) before the agent processes start. Each agent registers again with its own token when it
    starts, which replaces the credential made here."""
    nodes = []
    for index in range(count):
        demo_node = agent_demo.demo_node(index)
        _token, secret = bootstrap_token_create(actor=None, ttl_s=60, description=f"gpupool demo: {demo_node.name}")
        node, _credential = agent_register(token=secret, node_name=demo_node.name, hostname="gpupool-demo")
        hello = agent_demo.demo_hello(index)
        device_ids = node_hello(node_id=node.pk, hello=hello)
        nodes.append(DemoNodeRow(node_id=node.pk, demo=demo_node, device_ids=device_ids))
    return nodes


def start_demo_agents(*, server_url: str, count: int) -> list[subprocess.Popen]:
    """Start ``count`` simulated node agents as child processes connected to ``server_url``.

    Each gets a fresh one-time bootstrap token (written 0600 to its token file), so it registers as
    ``sim-NN`` whatever state an earlier run left behind; re-registering replaces the node's old credential.
    Returns the processes so the caller can stop them.
    """
    processes: list[subprocess.Popen] = []
    if count <= 0:
        return processes
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
