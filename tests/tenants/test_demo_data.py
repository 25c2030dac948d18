"""The demo data builds a valid tenant tree with quotas through the services (and only once)."""

from __future__ import annotations

import pytest

from portal.demo import load_demo_data
from scheduler.quota_usage import quota_usage
from tenants.models import Quota, Tenant

pytestmark = pytest.mark.django_db


def test_demo_data_has_quotas_that_respect_the_tree():
    assert load_demo_data(agents=0) is True
    assert load_demo_data(agents=0) is False
    vision = Tenant.objects.get(slug="acme-vision")
    usage = quota_usage(vision)
    assert usage["nvidia-h100-80g"]["guaranteed"] == 3000
    assert Quota.objects.filter(tenant__slug="acme").count() == 3
