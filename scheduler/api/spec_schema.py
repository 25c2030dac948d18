"""The job spec as an OpenAPI schema component (``JobSpec``), for documentation and typed clients.

Validation itself is ``scheduler.jobspec`` (one pass, clear messages, no DRF on the submit path); these
serializers only describe it, with the same field names, enums and limits, taken from that module's constants.
``tests/scheduler/test_api_typed.py`` checks both stay the same set of fields and that the example submits.
"""

from __future__ import annotations

from rest_framework import serializers

from scheduler import jobspec
from scheduler.models import MIN_FRACTION_MILLIS, JobKind, TopologyConstraint

JOB_SPEC_EXAMPLE = {
    "name": "resnet50",
    "tenant": "acme-vision",
    "kind": "training",
    "priority_class": "normal",
    "preemptible": True,
    "replicas": 1,
    "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1, "cpu_cores": 8, "host_memory_mib": 32768},
    "command": ["python", "-c", "print('hello from gpupool')"],
    "env": {"EPOCHS": "10"},
    "max_runtime_s": 3600,
}


class JobSpecResources(serializers.Serializer):
    flavors = serializers.ListField(
        child=serializers.SlugField(max_length=64),
        min_length=1,
        max_length=jobspec.MAX_FLAVORS,
        help_text="Acceptable flavors in order of preference (GET /api/v1/flavors/).",
    )
    flavor = serializers.SlugField(max_length=64, required=False, help_text="One flavor (instead of flavors).")
    any_flavor = serializers.BooleanField(
        required=False,
        help_text="The flavors are alternatives, not an order of preference: the scheduler picks the one where the "
        "job borrows, then fragments the pool, the least. Default false.",
    )
    gpus = serializers.IntegerField(
        min_value=1, max_value=jobspec.MAX_GPUS_PER_REPLICA, required=False, help_text="Whole cards per replica."
    )
    millis = serializers.IntegerField(
        min_value=MIN_FRACTION_MILLIS,
        max_value=900,
        required=False,
        help_text="A fraction of one card in thousandths, in steps of 100 (instead of gpus); needs memory_mib.",
    )
    memory_mib = serializers.IntegerField(
        min_value=0, max_value=16 * 1024 * 1024, required=False, help_text="Device memory (required with millis)."
    )
    cpu_cores = serializers.FloatField(min_value=0, max_value=jobspec.MAX_CPU_CORES, required=False)
    host_memory_mib = serializers.IntegerField(min_value=0, max_value=jobspec.MAX_HOST_MEMORY_MIB, required=False)


class JobSpecArray(serializers.Serializer):
    count = serializers.IntegerField(min_value=1, max_value=jobspec.MAX_ARRAY_COUNT)


class JobSpec(serializers.Serializer):
    name = serializers.CharField(max_length=jobspec.MAX_NAME_LENGTH)
    tenant = serializers.SlugField(
        required=False, help_text="Tenant slug; may be left out when the submitter is in one tenant only."
    )
    kind = serializers.ChoiceField(choices=JobKind.choices, default=JobKind.TRAINING)
    priority_class = serializers.ChoiceField(choices=list(jobspec.PRIORITY_NAMES), default="normal")
    preemptible = serializers.BooleanField(default=True)
    replicas = serializers.IntegerField(
        min_value=1, max_value=jobspec.MAX_REPLICAS, default=1, help_text="Gang size: all start together or none."
    )
    min_replicas = serializers.IntegerField(min_value=1, max_value=jobspec.MAX_REPLICAS, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=jobspec.MAX_REPLICAS, required=False)
    resources = JobSpecResources()
    topology = serializers.ChoiceField(choices=TopologyConstraint.choices, default=TopologyConstraint.NONE)
    node_selector = serializers.DictField(child=serializers.CharField(), required=False)
    command = serializers.ListField(
        child=serializers.CharField(max_length=jobspec.MAX_ARG_LENGTH),
        min_length=1,
        max_length=jobspec.MAX_COMMAND_ARGS,
        help_text="argv, run without a shell.",
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=jobspec.MAX_ENV_VALUE_LENGTH),
        required=False,
        help_text="POSIX names; loader variables (LD_*, PATH…) are refused.",
    )
    working_dir = serializers.CharField(max_length=jobspec.MAX_PATH_LENGTH, required=False)
    max_runtime_s = serializers.IntegerField(min_value=1, max_value=jobspec.MAX_RUNTIME_S, required=False)
    checkpoint_dir = serializers.CharField(max_length=jobspec.MAX_PATH_LENGTH, required=False)
    runtime_estimate_s = serializers.IntegerField(min_value=1, max_value=jobspec.MAX_RUNTIME_S, required=False)
    array = JobSpecArray(required=False, help_text="N independent copies; GPUPOOL_ARRAY_INDEX=0..N-1.")
    image = serializers.CharField(
        max_length=jobspec.MAX_IMAGE_LENGTH, required=False, help_text="OCI image, on nodes that run containers."
    )
    # Untyped lists and strings, checked by scheduler.jobspec: Swagger UI stops drawing the schema list past 100
    # components (drf-spectacular-sidecar's build), and this spec's parts would pass it.
    ports = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text='Named ports each replica serves, [{"name": "http", "ready_path": "/health"}]; each gets '
        "GPUPOOL_PORT_<NAME> and an endpoint.",
    )
    output_dir = serializers.CharField(
        max_length=jobspec.MAX_PATH_LENGTH,
        required=False,
        help_text="A dir (relative to the job dir) collected when each replica ends: GET /jobs/{id}/outputs/.",
    )
    launcher = serializers.CharField(
        required=False,
        help_text="none (default) or mpi: the command (mpirun …) runs on replica 0, the other replicas host its ranks.",
    )
