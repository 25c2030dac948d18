"""Tenant tree rules enforced by the services: depth, cycles, moved subtrees, duplicate names, audit."""

from __future__ import annotations

import pytest

from kernel.api import ConflictError, DomainError, PermissionDeniedError
from tenants.models import MAX_TENANT_DEPTH, Tenant
from tenants.services.tenancy import tenant_create, tenant_delete, tenant_update
from tests.factories import TenantFactory
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


def test_create_child_records_depth_and_audit(world):
    team = tenant_create(actor=world.users["tenant_admin"], name="Speech", slug="acme-speech", parent=world.research)
    assert team.depth == 3
    [record] = audited("tenant.create", target=f"tenant:{team.pk}")
    assert record["actor_username"] == "radmin"
    assert record["details"]["after"]["parent"] == "acme-research"


def test_create_beyond_max_depth_is_refused(world):
    leaf = TenantFactory(parent=world.vision)
    assert leaf.depth == MAX_TENANT_DEPTH
    with pytest.raises(DomainError, match="at most 4 levels"):
        tenant_create(actor=None, name="Too deep", slug="too-deep", parent=leaf)
    assert not Tenant.objects.filter(slug="too-deep").exists()


def test_moving_under_own_descendant_is_a_cycle(world):
    with pytest.raises(DomainError, match="cycle") as info:
        tenant_update(actor=world.users["system_admin"], tenant=world.research, parent=world.vision)
    assert info.value.code == "tenant_cycle"
    world.research.refresh_from_db()
    assert world.research.parent_id == world.acme.pk


def test_moving_under_itself_is_a_cycle(world):
    with pytest.raises(DomainError, match="cycle"):
        tenant_update(actor=None, tenant=world.vision, parent=world.vision)


def test_moving_a_subtree_that_would_exceed_depth_is_refused(world):
    # research has 2 levels (research → vision); under globex-team (depth 2) it would reach depth 4: fine.
    # Under a depth-3 tenant it would reach depth 5: refused.
    deep = TenantFactory(parent=world.globex_team)
    with pytest.raises(DomainError, match="would reach depth 5") as info:
        tenant_update(actor=None, tenant=world.research, parent=deep)
    assert info.value.code == "tenant_too_deep"
    assert Tenant.objects.get(pk=world.vision.pk).depth == 3


def test_move_updates_depth_of_the_whole_subtree(world):
    moved = tenant_update(actor=world.users["system_admin"], tenant=world.research, parent=None)
    assert moved.depth == 1 and moved.parent is None
    assert Tenant.objects.get(pk=world.vision.pk).depth == 2
    assert Tenant.objects.get(pk=world.nlp.pk).depth == 2
    [record] = audited("tenant.move")
    assert record["details"]["before"]["parent"] == "acme" and record["details"]["after"]["parent"] is None


def test_duplicate_sibling_name_is_refused_case_insensitively(world):
    with pytest.raises(DomainError, match="already exists under 'acme-research'"):
        tenant_create(actor=None, name="vision", slug="vision-2", parent=world.research)


def test_duplicate_top_level_name_is_refused(world):
    with pytest.raises(DomainError, match="at the top level"):
        tenant_create(actor=None, name="ACME", slug="acme-2")


def test_duplicate_slug_is_refused(world):
    with pytest.raises(DomainError, match="slug 'acme-nlp'"):
        tenant_create(actor=None, name="Other", slug="acme-nlp", parent=world.acme)


def test_move_into_a_sibling_with_same_name_is_refused(world):
    TenantFactory(name="Vision", slug="globex-vision", parent=world.globex)
    with pytest.raises(DomainError, match="already exists"):
        tenant_update(actor=None, tenant=world.vision, parent=world.globex)


def test_tenant_admin_cannot_move_its_own_tenant(world):
    with pytest.raises(PermissionDeniedError):
        tenant_update(actor=world.users["tenant_admin"], tenant=world.research, parent=world.globex)


def test_tenant_admin_moves_within_its_subtree(world):
    moved = tenant_update(actor=world.users["tenant_admin"], tenant=world.vision, parent=world.nlp)
    assert moved.parent == world.nlp and moved.depth == 4


def test_delete_refuses_tenant_with_children_or_members(world):
    with pytest.raises(ConflictError, match="child tenants"):
        tenant_delete(actor=None, tenant=world.research)
    with pytest.raises(ConflictError, match="members"):
        tenant_delete(actor=None, tenant=world.vision)


def test_auditor_cannot_change_anything(world):
    with pytest.raises(PermissionDeniedError, match="read-only"):
        tenant_update(actor=world.users["auditor"], tenant=world.vision, description="x")
