"""The console's submit form shows a job the pool can never run as refused, at the field, with the largest shape
there is, in the page's language (issue 33, item 2)."""

from __future__ import annotations

import pytest
from django.utils import translation

from scheduler.models import Job
from tests.frontend.factories import make_flavor, make_member, make_tenant
from tests.scheduler.factories import node_with_devices

pytestmark = pytest.mark.django_db

FORM = {
    "submit_form": "1",
    "f-tenant": "vision",
    "f-name": "too-big",
    "f-kind": "training",
    "f-priority_class": "normal",
    "f-preemptible": "on",
    "f-replicas": "1",
    "f-flavor": "sim-80g",
    "f-size": "whole",
    "f-gpus": "16",
    "f-command": "python train.py",
}


@pytest.fixture
def bob():
    make_flavor("sim-80g")
    node_with_devices(8, name="gpu-1")
    return make_member(make_tenant("vision"), username="bob")


def test_the_form_refuses_more_cards_than_a_node_has_naming_the_largest_node(client, bob):
    client.force_login(bob)
    response = client.post("/console/jobs/submit/", FORM)
    assert response.status_code == 200
    page = response.content.decode()
    assert "per-replica cards: 16 asked, the largest sim-80g node has 8" in page
    assert not Job.objects.filter(name="too-big").exists()


def test_the_refusal_reads_in_chinese(client, bob):
    client.force_login(bob)
    with translation.override("zh-hans"):
        response = client.post("/console/jobs/submit/", FORM, HTTP_ACCEPT_LANGUAGE="zh-hans")
    page = response.content.decode()
    assert "每副本卡数：申请 16，最大的 sim-80g 节点只有 8 张" in page, page[-3000:]  # noqa: RUF001
    assert not Job.objects.filter(name="too-big").exists()
