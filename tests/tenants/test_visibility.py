"""Who sees which tenants: members their subtree, parent tenant admins the subtree below, platform roles all."""

from __future__ import annotations

import pytest

from tenants.models import MembershipRole
from tenants.permissions import can_admin_tenant, is_auditor, is_security_admin, is_system_admin, tenant_role
from tenants.selectors import tenant_subtree_height, tenants_visible_to
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def _slugs(user) -> set[str]:
    return set(tenants_visible_to(user).values_list("slug", flat=True))


def test_member_sees_only_its_team(world):
    assert _slugs(world.users["member"]) == {"acme-vision"}


def test_parent_tenant_admin_sees_its_subtree_but_not_its_parent(world):
    assert _slugs(world.users["tenant_admin"]) == {"acme-research", "acme-vision", "acme-nlp"}


@pytest.mark.parametrize("role", ["system_admin", "security_admin", "auditor"])
def test_platform_roles_see_every_tenant(world, role):
    assert _slugs(world.users[role]) == {"acme", "acme-research", "acme-vision", "acme-nlp", "globex", "globex-team"}


def test_user_without_membership_sees_nothing(world):
    assert _slugs(UserFactory()) == set()


def test_inactive_user_sees_nothing(world):
    user = world.users["tenant_admin"]
    user.is_active = False
    user.save()
    assert _slugs(user) == set()


def test_membership_at_depth_four_reaches_only_itself(world):
    leaf = TenantFactory(slug="acme-vision-leaf", parent=world.vision)
    user = UserFactory()
    MembershipFactory(user=user, tenant=leaf)
    assert _slugs(user) == {"acme-vision-leaf"}
    assert leaf.depth == 4
    assert tenant_subtree_height(world.acme) == 4


def test_tenant_role_is_inherited_and_strongest_wins(world):
    admin = world.users["tenant_admin"]
    MembershipFactory(user=admin, tenant=world.vision, role=MembershipRole.VIEWER)
    assert tenant_role(admin, world.vision) == MembershipRole.TENANT_ADMIN
    assert tenant_role(admin, world.acme) is None
    assert can_admin_tenant(admin, world.nlp)
    assert not can_admin_tenant(admin, world.acme)
    assert not can_admin_tenant(world.users["member"], world.vision)


def test_platform_role_predicates_are_exclusive(world):
    for role, predicate in [
        ("system_admin", is_system_admin),
        ("security_admin", is_security_admin),
        ("auditor", is_auditor),
    ]:
        holders = [name for name, user in world.users.items() if predicate(user)]
        assert holders == [role]
