import pytest

from tests.patching import patch_request_cycle
from tests.scheduler.factories import FlavorFactory, MembershipFactory, TenantFactory, UserFactory, node_with_devices


@pytest.fixture
def flavor(db):
    return FlavorFactory()


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="team-a")


@pytest.fixture
def member(tenant):
    user = UserFactory(username="member-a")
    MembershipFactory(user=user, tenant=tenant, role="member")
    return user


@pytest.fixture
def node(flavor):
    return node_with_devices(2, name="node-a")


@pytest.fixture
def no_cycle_requests(monkeypatch):
    """Record request_cycle calls instead of queueing Celery tasks."""
    calls = []
    patch_request_cycle(monkeypatch, lambda: calls.append(1))
    return calls


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Argon2 is deliberately slow; these tests do not test password hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def unlimited_tenants_by_default(settings):
    # Most tests here are about placement, not quotas: tenants without quota rows may use the pool.
    # Quota tests set GPUPOOL_SCHEDULER_POLICY themselves.
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
