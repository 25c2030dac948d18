"""Inventory from an agent's hello: upserts by UUID, index moves, flavor mapping."""

from __future__ import annotations

import dataclasses

import pytest

from catalog.models import ResourceFlavor
from scheduler.fleet.models import Device
from scheduler.fleet.services.inventory import node_hello
from tests.fleet.conftest import hello, register_node

pytestmark = pytest.mark.django_db


def say_hello(node, frame) -> dict[str, int]:
    return node_hello(node_id=node.pk, hello=dataclasses.asdict(frame))


def test_cards_that_swap_indexes_are_updated_without_a_uniqueness_clash():
    node, _credential = register_node("n1")
    frame = hello("n1", devices=2)
    first = say_hello(node, frame)
    frame.devices[0].index, frame.devices[1].index = 1, 0
    second = say_hello(node, frame)
    assert first == second  # the same rows, by UUID
    assert dict(Device.objects.filter(node=node).values_list("uuid", "index")) == {"GPU-n1-0": 1, "GPU-n1-1": 0}


def test_a_configured_mapping_picks_the_flavor(settings):
    ResourceFlavor.objects.create(name="big-gpu", vendor="nvidia", model="whatever", memory_mib=1)
    settings.GPUPOOL_FLAVOR_MAP = {"NVIDIA H100 80GB HBM3": "big-gpu"}
    node, _credential = register_node("n1")
    say_hello(node, hello("n1", devices=1))
    assert Device.objects.get(uuid="GPU-n1-0").flavor.name == "big-gpu"


def test_link_domains_from_the_hello_are_stored():
    node, _credential = register_node("n1")
    frame = hello("n1", devices=2)
    for device in frame.devices:
        device.nvlink_domain, device.pcie_switch = "nvl-0", "sw-1"
    say_hello(node, frame)
    assert set(Device.objects.filter(node=node).values_list("nvlink_domain", "pcie_switch")) == {("nvl-0", "sw-1")}


def test_one_unknown_model_creates_one_flavor_for_all_its_cards():
    node, _credential = register_node("n1")
    say_hello(node, hello("n1", devices=8, model="Hygon K100"))
    assert ResourceFlavor.objects.filter(model="Hygon K100").count() == 1
    assert Device.objects.filter(node=node, flavor__model="Hygon K100").count() == 8
