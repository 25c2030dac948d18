import pytest

from scheduler.jobspec import JobSpecError, validate_job_spec

FLAVORS = {"nvidia-h100-80g", "ascend-910b"}


def spec(**overrides):
    base = {"name": "train", "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 2}, "command": ["python", "t.py"]}
    base.update(overrides)
    return base


def test_whole_cards_become_n_times_1000_millis():
    parsed = validate_job_spec(spec(replicas=3), known_flavors=FLAVORS)
    assert parsed.millis_per_replica == 2000
    assert parsed.total_millis == 6000
    assert parsed.priority_class == 500
    assert parsed.normalised["resources"]["gpus"] == 2


def test_fraction_needs_memory_and_a_step_of_10():
    parsed = validate_job_spec(
        spec(resources={"flavor": "ascend-910b", "millis": 470, "memory_mib": 8192}), known_flavors=FLAVORS
    )
    assert (parsed.millis_per_replica, parsed.memory_mib_per_replica, parsed.flavors) == (470, 8192, ("ascend-910b",))
    with pytest.raises(JobSpecError, match="memory_mib: is required"):
        validate_job_spec(spec(resources={"flavors": ["ascend-910b"], "millis": 300}), known_flavors=FLAVORS)
    with pytest.raises(JobSpecError, match=r"multiple of 10 \(1/100 card\)"):
        validate_job_spec(
            spec(resources={"flavors": ["ascend-910b"], "millis": 255, "memory_mib": 1}), known_flavors=FLAVORS
        )
    assert (
        validate_job_spec(
            spec(resources={"flavors": ["ascend-910b"], "millis": 990, "memory_mib": 1}), known_flavors=FLAVORS
        ).millis_per_replica
        == 990
    )
    for millis in (0, 50, 1000, 1500):
        with pytest.raises(JobSpecError, match=r"resources\.millis"):
            validate_job_spec(
                spec(resources={"flavors": ["ascend-910b"], "millis": millis, "memory_mib": 1}), known_flavors=FLAVORS
            )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"colour": "blue"}, "colour"),
        ({"resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1, "gpu": 1}}, "resources.gpu"),
        ({"resources": {"flavors": ["nope"], "gpus": 1}}, "resources.flavors"),
        ({"resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1, "millis": 500}}, "resources"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"command": []}, "command"),
        ({"command": "python t.py"}, "command"),
        ({"command": ["python", 3]}, "command[1]"),
        ({"env": {"A": 1}}, "env.A"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"name": ""}, "name"),
        ({"name": "x" * 200}, "name"),
        ({"kind": "mining"}, "kind"),
        ({"priority_class": "urgent"}, "priority_class"),
        ({"topology": "ring"}, "topology"),
        ({"max_runtime_s": -1}, "max_runtime_s"),
        ({"min_replicas": 1}, "min_replicas"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(overrides, field):
    with pytest.raises(JobSpecError) as caught:
        validate_job_spec(spec(**overrides), known_flavors=FLAVORS)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}:")


def test_inference_replica_bounds_are_checked():
    parsed = validate_job_spec(
        spec(kind="inference", replicas=2, min_replicas=1, max_replicas=4), known_flavors=FLAVORS
    )
    assert (parsed.min_replicas, parsed.max_replicas) == (1, 4)
    with pytest.raises(JobSpecError, match="max_replicas"):
        validate_job_spec(spec(kind="inference", replicas=3, max_replicas=2), known_flavors=FLAVORS)


def test_priority_accepts_names_and_values():
    assert validate_job_spec(spec(priority_class="critical"), known_flavors=FLAVORS).priority_class == 1000
    assert validate_job_spec(spec(priority_class=0), known_flavors=FLAVORS).priority_class == 0


def test_a_spec_must_be_an_object():
    with pytest.raises(JobSpecError, match="JSON object"):
        validate_job_spec(["name"], known_flavors=FLAVORS)


def test_flavors_may_be_alternatives_instead_of_an_order_of_preference():
    two = {"flavors": ["nvidia-h100-80g", "ascend-910b"], "gpus": 1}
    assert validate_job_spec(spec(resources=two), known_flavors=FLAVORS).any_flavor is False
    parsed = validate_job_spec(spec(resources={**two, "any_flavor": True}), known_flavors=FLAVORS)
    assert parsed.any_flavor is True and parsed.normalised["resources"]["any_flavor"] is True
    with pytest.raises(JobSpecError, match=r"resources\.any_flavor: must be true or false"):
        validate_job_spec(spec(resources={**two, "any_flavor": "yes"}), known_flavors=FLAVORS)
