"""Every sentence the scheduler's services and the job spec (submit, cancel, arrays,
nodes, outputs, what-if) may show a user: a stable code and its English template
(``kernel.messages``).

Raise one as ``DomainError(messages.NAME(param=value))``; the console, the API and e-mail render it in the
reader's language from the template, which is the gettext msgid (translations: frontend/locale).
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

from kernel.messages import Message

NO_TENANT_VISIBLE_YOU = Message(
    "scheduler.no_tenant_visible_you", gettext_noop("No tenant '%(tenant)s' is visible to you.")
)
YOU_MAY_NOT_SUBMIT_JOBS = Message(
    "scheduler.you_may_not_submit_jobs",
    gettext_noop(
        "You may not submit jobs to %(tenant)s: members and tenant admins may; ask a tenant admin for the member role."
    ),
)
TENANT_SAY_WHICH_TENANT_JOB = Message(
    "scheduler.tenant_say_which_tenant_job",
    gettext_noop("tenant: say which tenant the job belongs to."),
)
TENANT_YOU_BELONG_SEVERAL_TENANTS = Message(
    "scheduler.tenant_you_belong_several_tenants",
    gettext_noop('tenant: you belong to several tenants (or none that may submit); name one with "tenant": "<slug>".'),
)
ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM = Message(
    "scheduler.only_submitter_tenant_admin_system",
    gettext_noop("Only the submitter, a tenant admin or a system admin may cancel this job."),
)
ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM_ADMIN = Message(
    "scheduler.only_submitter_tenant_admin_system_admin",
    gettext_noop("Only the submitter, a tenant admin or a system admin may cancel this array."),
)
ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM_ADMIN_MAY = Message(
    "scheduler.only_submitter_tenant_admin_system_admin_may",
    gettext_noop("Only the submitter, a tenant admin or a system admin may scale this job."),
)
ARRAY_SAY_HOW_MANY_JOBS = Message(
    "scheduler.array_say_how_many_jobs",
    gettext_noop('array: say how many jobs to create, e.g. "array": {"count": 100}.'),
)
NO_JOB_ARRAY = Message("scheduler.no_job_array", gettext_noop("No job array %(pk)s."))
ARRAY_TASKS_ALREADY_ROWS = Message(
    "scheduler.array_tasks_already_rows",
    gettext_noop("Some of these tasks of array %(array_id)s are no longer waiting to start; nothing was changed."),
)
ARRAY_INDICES_INVALID = Message(
    "scheduler.array_indices_invalid",
    gettext_noop("indices: %(problem)s (the array has tasks 0-%(last)s; write them as 3-7,9)."),
)
INDICES_ONLY_ARRAY_CANCEL = Message(
    "scheduler.indices_only_array_cancel",
    gettext_noop("indices: only an array's cancel takes indices (POST /api/v1/jobs/arrays/<id>/cancel/)."),
)
NO_ARRAY_TASK = Message(
    "scheduler.no_array_task",
    gettext_noop("Array %(array_id)s has no task %(index)s (its tasks are 0-%(last)s)."),
)
ARRAY_TASK_CANCELLED_BEFORE_START = Message(
    "scheduler.array_task_cancelled_before_start",
    gettext_noop("Task %(index)s of array %(array_id)s was cancelled before it started: it has no job."),
)
NO_JOB_ID = Message("scheduler.no_job_id", gettext_noop("No job with id %(pk)s."))
NO_JOB_ID_VISIBLE_YOU = Message(
    "scheduler.no_job_id_visible_you", gettext_noop("No job with id %(pk)s is visible to you.")
)
NO_JOB_ARRAY_VISIBLE_YOU = Message(
    "scheduler.no_job_array_visible_you",
    gettext_noop("No job array %(pk)s is visible to you."),
)
NO_NODE_ID = Message("scheduler.no_node_id", gettext_noop("No node with id %(pk)s."))
JOB_ALREADY_THERE_NOTHING_CANCEL = Message(
    "scheduler.job_already_there_nothing_cancel",
    gettext_noop("Job %(pk)s is already %(state)s; there is nothing to cancel."),
)
JOB_NOT_WAITING_APPROVAL = Message(
    "scheduler.job_not_waiting_approval",
    gettext_noop("Job %(pk)s is %(state)s, not waiting for approval."),
)
JOB_THERE_NOTHING_SCALE = Message(
    "scheduler.job_there_nothing_scale",
    gettext_noop("Job %(pk)s is %(state)s; there is nothing to scale."),
)
JOB_CANNOT_BECOME = Message(
    "scheduler.job_cannot_become",
    gettext_noop("Job %(pk)s is %(state)s; it cannot become %(to_state)s."),
)
NEW_JOB_CANNOT_START = Message("scheduler.new_job_cannot_start", gettext_noop("A new job cannot start %(to_state)s."))
JOB_JOB_ONLY_INFERENCE_SERVICES = Message(
    "scheduler.job_job_only_inference_services",
    gettext_noop("Job %(pk)s is a %(job_kind)s job; only inference services scale."),
)
REPLICAS_MUST_BETWEEN_MIN_REPLICAS = Message(
    "scheduler.replicas_must_between_min_replicas",
    gettext_noop(
        "replicas: must be between min_replicas (%(least)s) and max_replicas (%(most)s); submit the service with "
        "a larger max_replicas to scale further."
    ),
)
ONLY_SYSTEM_ADMIN_MAY_CHANGE = Message(
    "scheduler.only_system_admin_may_change",
    gettext_noop("Only a system admin may change nodes and flavors."),
)
FLAVOR_NAMED_ALREADY_EXISTS = Message(
    "scheduler.flavor_named_already_exists",
    gettext_noop("A flavor named '%(name)s' already exists."),
)
ONLY_SYSTEM_ADMIN_MAY_RE = Message(
    "scheduler.only_system_admin_may_re",
    gettext_noop("Only a system admin may re-home a device."),
)
DEVICE_STILL_HOLDS_RUNNING_ALLOCATION = Message(
    "scheduler.device_still_holds_running_allocation",
    gettext_noop("Device %(device)s still holds a running allocation; drain node %(node)s or cancel the job first."),
)
TTL_MUST_BETWEEN_SECONDS_DAYS = Message(
    "scheduler.ttl_must_between_seconds_days",
    gettext_noop("ttl must be between 60 seconds and %(days)s days; got %(ttl)s seconds."),
)
JOB_SPEC_MUST_JSON_OBJECT = Message(
    "scheduler.job_spec_must_json_object",
    gettext_noop("A job spec must be a JSON object."),
)
CHECKPOINT_DIR_NOT_UNDER_CHECKPOINT = Message(
    "scheduler.checkpoint_dir_not_under_checkpoint",
    gettext_noop(
        "checkpoint_dir: '%(path)s' is not under a checkpoint prefix of tenant %(tenant)s (none are configured "
        "for it: use a relative path (in the job dir)); an administrator sets them in "
        "GPUPOOL_CHECKPOINT_PREFIXES."
    ),
)
CHECKPOINT_DIR_NOT_UNDER_CHECKPOINT_PREFIX = Message(
    "scheduler.checkpoint_dir_not_under_checkpoint_prefix",
    gettext_noop(
        "checkpoint_dir: '%(path)s' is not under a checkpoint prefix of tenant %(tenant)s (%(prefixes)s); an "
        "administrator sets them in GPUPOOL_CHECKPOINT_PREFIXES."
    ),
)
RESOURCES_FLAVORS_UNKNOWN_FLAVOR_KNOWN = Message(
    "scheduler.resources_flavors_unknown_flavor_known",
    gettext_noop("resources.flavors: unknown flavor '%(flavor)s'; known flavors: none are defined yet."),
)
RESOURCES_FLAVORS_UNKNOWN_FLAVOR_KNOWN_FLAVORS = Message(
    "scheduler.resources_flavors_unknown_flavor_known_flavors",
    gettext_noop("resources.flavors: unknown flavor '%(flavor)s'; known flavors: %(known)s."),
)
MUST_WHOLE_NUMBER_BETWEEN_GOT = Message(
    "scheduler.must_whole_number_between_got",
    gettext_noop("%(field)s: must be a whole number between %(low)s and %(high)s, got %(value)s."),
)
MUST_BETWEEN_GOT = Message(
    "scheduler.must_between_got",
    gettext_noop("%(field)s: must be between %(low)s and %(high)s, got %(value)s."),
)
MUST_STRING_GOT_QUOTE_NUMBERS = Message(
    "scheduler.must_string_got_quote_numbers",
    gettext_noop("%(field)s: must be a string, got %(type)s (quote numbers)."),
)
MUST_STRING_GOT = Message("scheduler.must_string_got", gettext_noop("%(field)s: must be a string, got %(type)s."))
REQUIRED_MUST_NOT_EMPTY = Message(
    "scheduler.required_must_not_empty",
    gettext_noop("%(field)s: is required and must not be empty."),
)
MUST_MOST_CHARACTERS_GOT = Message(
    "scheduler.must_most_characters_got",
    gettext_noop("%(field)s: must be at most %(max)s characters, got %(n)s."),
)
MUST_MOST_CHARACTERS_WITHOUT_NUL = Message(
    "scheduler.must_most_characters_without_nul",
    gettext_noop("%(field)s: must be at most %(max)s characters without NUL bytes."),
)
MUST_ONE_GOT = Message("scheduler.must_one_got", gettext_noop("%(field)s: must be one of %(choices)s; got %(value)s."))
MUST_OBJECT_STRINGS = Message(
    "scheduler.must_object_strings",
    gettext_noop("%(field)s: must be an object of strings, e.g. %(example)s."),
)
MAY_HOLD_MOST_ENTRIES_GOT = Message(
    "scheduler.may_hold_most_entries_got",
    gettext_noop("%(field)s: may hold at most %(max)s entries, got %(n)s."),
)
KEYS_MUST_NON_EMPTY_STRINGS = Message(
    "scheduler.keys_must_non_empty_strings",
    gettext_noop("%(field)s: keys must be non-empty strings of at most %(max)s characters."),
)
NOT_KNOWN_FIELD_ALLOWED = Message(
    "scheduler.not_known_field_allowed",
    gettext_noop("%(field)s: is not a known field; allowed: %(allowed)s."),
)
MUST_NOT_CONTAIN_NUL_BYTE = Message(
    "scheduler.must_not_contain_nul_byte",
    gettext_noop("%(field)s: must not contain a NUL byte."),
)
MUST_RELATIVE_PATH_INSIDE_JOBS = Message(
    "scheduler.must_relative_path_inside_jobs",
    gettext_noop("%(field)s: must be a relative path inside the job's directory, without '..', e.g. src/train."),
)
ABSOLUTE_PATH_MUST_PLAIN_NO = Message(
    "scheduler.absolute_path_must_plain_no",
    gettext_noop("%(field)s: an absolute path must be plain: no '..', no backslash, e.g. /ckpt/acme/resnet50."),
)
ENV_MAY_HOLD_MOST_VARIABLES = Message(
    "scheduler.env_may_hold_most_variables",
    gettext_noop("env: may hold at most %(max)s variables, got %(n)s."),
)
ENV_VARIABLE_NOT_VALID_NAME = Message(
    "scheduler.env_variable_not_valid_name",
    gettext_noop(
        "env: variable '%(key)s' is not a valid name; names are letters, digits and '_', not starting with a "
        "digit (e.g. MY_VAR)."
    ),
)
ENV_VARIABLE_CONTAINS_NAMES_LETTERS = Message(
    "scheduler.env_variable_contains_names_letters",
    gettext_noop(
        "env: variable '%(key)s' contains '='; names are letters, digits and '_', not starting with a digit "
        "(e.g. MY_VAR)."
    ),
)
ENV_VARIABLE_CONTAINS_NUL_BYTE = Message(
    "scheduler.env_variable_contains_nul_byte",
    gettext_noop(
        "env: variable '%(key)s' contains a NUL byte; names are letters, digits and '_', not starting with a "
        "digit (e.g. MY_VAR)."
    ),
)
NAME_MUST_MOST_CHARACTERS = Message(
    "scheduler.name_must_most_characters",
    gettext_noop("%(field)s: the name must be at most %(max)s characters."),
)
VALUE_MUST_NOT_CONTAIN_NUL = Message(
    "scheduler.value_must_not_contain_nul",
    gettext_noop("%(field)s: the value must not contain a NUL byte."),
)
VALUE_MUST_MOST_CHARACTERS_GOT = Message(
    "scheduler.value_must_most_characters_got",
    gettext_noop("%(field)s: the value must be at most %(max)s characters, got %(n)s."),
)
GPUPOOL_CUDA_SET_PLATFORM_REMOVE = Message(
    "scheduler.gpupool_cuda_set_platform_remove",
    gettext_noop("%(field)s: GPUPOOL_* and CUDA_* are set by the platform; remove it."),
)
MAY_NOT_SET_JOB_STEERS = Message(
    "scheduler.may_not_set_job_steers",
    gettext_noop(
        "%(field)s: %(name)s may not be set by a job: it steers the loader or libc of every process the job "
        "starts, or the platform's search path (denied: %(denied)s). Use absolute paths in command, or set it "
        "inside your own script."
    ),
)
ARRAY_MUST_OBJECT_COUNT_ARRAY = Message(
    "scheduler.array_must_object_count_array",
    gettext_noop('array: must be an object with a count, e.g. "array": {"count": 100}.'),
)
ARRAY_COUNT_REQUIRED_HOW_MANY = Message(
    "scheduler.array_count_required_how_many",
    gettext_noop('array.count: is required: how many jobs to create, e.g. "array": {"count": 100}.'),
)
RESOURCES_REQUIRED_FLAVORS_NVIDIA_H = Message(
    "scheduler.resources_required_flavors_nvidia_h",
    gettext_noop('resources: is required: e.g. {"flavors": ["nvidia-h100-80g"], "gpus": 1}.'),
)
RESOURCES_FLAVORS_GIVE_EITHER_FLAVOR = Message(
    "scheduler.resources_flavors_give_either_flavor",
    gettext_noop("resources.flavors: give either flavor or flavors, not both."),
)
RESOURCES_FLAVORS_MUST_NON_EMPTY = Message(
    "scheduler.resources_flavors_must_non_empty",
    gettext_noop("resources.flavors: must be a non-empty list of flavor names (any of them will do)."),
)
RESOURCES_FLAVORS_MAY_NAME_MOST = Message(
    "scheduler.resources_flavors_may_name_most",
    gettext_noop("resources.flavors: may name at most %(max)s flavors."),
)
RESOURCES_ASK_WHOLE_CARDS_GPUS = Message(
    "scheduler.resources_ask_whole_cards_gpus",
    gettext_noop(
        'resources: ask for whole cards with "gpus": N, or a fraction of one card with "millis" (100..990) '
        'and "memory_mib".'
    ),
)
RESOURCES_MILLIS_MUST_MULTIPLE_CARD = Message(
    "scheduler.resources_millis_must_multiple_card",
    gettext_noop("resources.millis: must be a multiple of %(step)s (1/100 card), got %(value)s."),
)
RESOURCES_MEMORY_MIB_REQUIRED_FRACTIONAL = Message(
    "scheduler.resources_memory_mib_required_fractional",
    gettext_noop("resources.memory_mib: is required for a fractional card: say how much device memory."),
)
RESOURCES_CPU_CORES_MUST_NUMBER = Message(
    "scheduler.resources_cpu_cores_must_number",
    gettext_noop("resources.cpu_cores: must be a number between 0 and %(max)s."),
)
RESOURCES_ANY_FLAVOR_MUST_TRUE = Message(
    "scheduler.resources_any_flavor_must_true",
    gettext_noop("resources.any_flavor: must be true or false."),
)
TENANT_MUST_TENANT_SLUG = Message("scheduler.tenant_must_tenant_slug", gettext_noop("tenant: must be a tenant slug."))
PREEMPTIBLE_MUST_TRUE_FALSE = Message(
    "scheduler.preemptible_must_true_false",
    gettext_noop("preemptible: must be true or false."),
)
MIN_REPLICAS_MIN_REPLICAS_MAX = Message(
    "scheduler.min_replicas_min_replicas_max",
    gettext_noop("min_replicas: min_replicas and max_replicas apply to inference jobs only."),
)
MIN_REPLICAS_MUST_NOT_EXCEED = Message(
    "scheduler.min_replicas_must_not_exceed",
    gettext_noop("min_replicas: must not exceed replicas (%(n)s)."),
)
MAX_REPLICAS_MUST_LEAST_REPLICAS = Message(
    "scheduler.max_replicas_must_least_replicas",
    gettext_noop("max_replicas: must be at least replicas (%(n)s)."),
)
COMMAND_MUST_NON_EMPTY_LIST = Message(
    "scheduler.command_must_non_empty_list",
    gettext_noop('command: must be a non-empty list of strings, e.g. ["python", "train.py"].'),
)
COMMAND_MAY_HOLD_MOST_ARGUMENTS = Message(
    "scheduler.command_may_hold_most_arguments",
    gettext_noop("command: may hold at most %(max)s arguments."),
)
COMMAND_PROGRAM_RUN_MUST_NOT = Message(
    "scheduler.command_program_run_must_not",
    gettext_noop("command[0]: the program to run must not be empty."),
)
IMAGE_MUST_OCI_IMAGE_REFERENCE = Message(
    "scheduler.image_must_oci_image_reference",
    gettext_noop("image: must be an OCI image reference, e.g. docker.io/pytorch/pytorch:2.3.0-cuda12.1."),
)
NODE_SELECTOR_JOB_IMAGE_NEEDS = Message(
    "scheduler.node_selector_job_image_needs",
    gettext_noop("node_selector: a job with an image needs %(label)s=true; remove that selector."),
)
ONLY_SYSTEM_ADMIN_MAY_RUN = Message(
    "scheduler.only_system_admin_may_run",
    gettext_noop("Only a system admin may run a what-if."),
)
SAY_WHAT_CHANGE_PREEMPTION_FALSE = Message(
    "scheduler.say_what_change_preemption_false",
    gettext_noop("say what to change, e.g. preemption=false"),
)
NO_JOB_RAN_BETWEEN_CHOOSE = Message(
    "scheduler.no_job_ran_between_choose",
    gettext_noop("no job ran between %(since)s and %(until)s; choose a longer window"),
)
WINDOW_HOLDS_JOBS_MORE_WEB = Message(
    "scheduler.window_holds_jobs_more_web",
    gettext_noop(
        "the window holds %(jobs)s jobs, more than the %(cap)s a web request replays; choose fewer days, or run "
        "`gpupool whatif` on the server"
    ),
)
ONLY_SYSTEM_ADMIN_MAY_EXPORT = Message(
    "scheduler.only_system_admin_may_export",
    gettext_noop("Only a system admin may export the job history."),
)
UNKNOWN_FORMAT_USE_ONE = Message(
    "scheduler.unknown_format_use_one",
    gettext_noop("unknown format '%(value)s'; use one of %(choices)s"),
)
DAYS_MUST_MORE_MOST = Message(
    "scheduler.days_must_more_most",
    gettext_noop("days must be more than 0 and at most %(max)s"),
)
WINDOW_STARTS_BEFORE_YEAR_CHOOSE = Message(
    "scheduler.window_starts_before_year_choose",
    gettext_noop("the window starts before the year 1; choose a later until"),
)
SINCE_MUST_BEFORE_UNTIL = Message("scheduler.since_must_before_until", gettext_noop("since must be before until"))
WINDOW_LONGER_DAYS_EXPORT_PARTS = Message(
    "scheduler.window_longer_days_export_parts",
    gettext_noop("the window is longer than %(max)s days; export it in parts"),
)
RECORDS_NOT_COVERED_CHECKPOINT_YET = Message(
    "scheduler.records_not_covered_checkpoint_yet",
    gettext_noop("The records are not covered by a checkpoint yet; try again in a moment."),
)
JOB_SPEC_CONTAINS_NUL_CHARACTER = Message(
    "scheduler.job_spec_contains_nul_character",
    gettext_noop("the job spec contains a NUL character (\\u0000); remove it and send the request again."),
)
JOB_SPEC_CONTAINS_NUL_CHARACTER_REMOVE = Message(
    "scheduler.job_spec_contains_nul_character_remove",
    gettext_noop(
        "the job spec (at %(path)s) contains a NUL character (\\u0000); remove it and send the request again."
    ),
)
KEY_JOB_SPEC_CONTAINS_NUL = Message(
    "scheduler.key_job_spec_contains_nul",
    gettext_noop("a key of the job spec contains a NUL character (\\u0000); remove it and send the request again."),
)
KEY_JOB_SPEC_CONTAINS_NUL_CHARACTER = Message(
    "scheduler.key_job_spec_contains_nul_character",
    gettext_noop(
        "a key of the job spec (at %(path)s) contains a NUL character (\\u0000); remove it and send the request again."
    ),
)
JOB_SPEC_NESTS_OBJECTS_ARRAYS = Message(
    "scheduler.job_spec_nests_objects_arrays",
    gettext_noop("the job spec nests objects and arrays more than %(max)s levels deep; send a flatter document."),
)
EXPECTED_NAME_VALUE_NAME_ONE = Message(
    "scheduler.expected_name_value_name_one",
    gettext_noop("%(pair)s: expected NAME=VALUE with NAME one of %(names)s"),
)
UNKNOWN_SETTING_SETTINGS = Message(
    "scheduler.unknown_setting_settings",
    gettext_noop("unknown setting '%(unknown)s'; the settings are %(names)s"),
)
EXPECTED_TRUE_FALSE_GOT = Message(
    "scheduler.expected_true_false_got",
    gettext_noop("%(setting)s: expected true or false, got %(value)s"),
)
EXPECTED_NUMBER_NONE_GOT = Message(
    "scheduler.expected_number_none_got",
    gettext_noop("%(setting)s: expected a number or none, got %(value)s"),
)
EXPECTED_NUMBER_GOT = Message(
    "scheduler.expected_number_got",
    gettext_noop("%(setting)s: expected a number, got %(value)s"),
)
EXPECTED_NUMBER_LEAST_GOT = Message(
    "scheduler.expected_number_least_got",
    gettext_noop("%(setting)s: expected a number of at least 0, got %(value)s"),
)
EXPECTED_WHOLE_NUMBER_GOT = Message(
    "scheduler.expected_whole_number_got",
    gettext_noop("%(setting)s: expected a whole number, got %(value)s"),
)
EXPECTED_ONE_GOT = Message(
    "scheduler.expected_one_got",
    gettext_noop("%(setting)s: expected one of %(choices)s, got %(value)s"),
)
NAMED_TWICE_GIVE_EACH_PORT = Message(
    "scheduler.named_twice_give_each_port",
    gettext_noop("%(field)s: %(value)s is named twice; give each port its own name."),
)
MUST_LOWER_CASE_LETTERS_DIGITS = Message(
    "scheduler.must_lower_case_letters_digits",
    gettext_noop(
        "%(field)s: must be 1-15 lower-case letters, digits or '-', starting with a letter (not 'replica' or "
        "'rendezvous'), e.g. http."
    ),
)
MUST_URL_PATH_STARTING_HEALTH = Message(
    "scheduler.must_url_path_starting_health",
    gettext_noop("%(field)s: must be a URL path starting with '/', e.g. /health."),
)
UNKNOWN_FIELD_PORT = Message(
    "scheduler.unknown_field_port",
    gettext_noop("%(field)s: unknown field; a port has %(fields)s."),
)
MUST_OBJECT_SUCH_NAME_HTTP = Message(
    "scheduler.must_object_such_name_http",
    gettext_noop('%(field)s: must be an object such as {"name": "http"}.'),
)
PORTS_MOST_NAMED_PORTS = Message("scheduler.ports_most_named_ports", gettext_noop("ports: at most %(n)s named ports."))
PORTS_MUST_LIST_SUCH_NAME = Message(
    "scheduler.ports_must_list_such_name",
    gettext_noop('ports: must be a list such as [{"name": "http", "ready_path": "/health"}].'),
)
LAUNCHER_MUST_ONE_NOT = Message(
    "scheduler.launcher_must_one_not", gettext_noop("launcher: must be one of %(choices)s, not %(value)s.")
)
CHECKPOINT_DIR_SHARED_STORAGE_WHERE = Message(
    "scheduler.checkpoint_dir_shared_storage_where",
    gettext_noop(
        "checkpoint_dir: %(value)s is on the shared storage, where each job gets its own checkpoint dir: give a "
        "relative checkpoint_dir (or none) and the job gets <shared>/tenants/<tenant>/jobs/<job>/<it>."
    ),
)
NODE_NEVER_RAN_REPLICA_JOB = Message(
    "scheduler.node_never_ran_replica_job",
    gettext_noop("Node %(node)s never ran replica %(replica)s of job %(job)s."),
)
OUTPUT_OVER_GPUPOOL_OUTPUT_MAX = Message(
    "scheduler.output_over_gpupool_output_max",
    gettext_noop("the output is over GPUPOOL_OUTPUT_MAX_BYTES (%(n)s bytes)."),
)
UPLOAD_NOT_MATCH_SHA_SEND = Message(
    "scheduler.upload_not_match_sha_send",
    gettext_noop("the upload does not match its sha256; send it again."),
)
NEVER_FITS = Message("scheduler.never_fits", gettext_noop("%(field)s: never fits: %(sentences)s; %(fix)s."))

# --- notifications, rendered in the recipient's language
GPUPOOL_JOB_CAN_NEVER_START = Message(
    "scheduler.gpupool_job_can_never_start",
    gettext_noop("[gpupool] Job %(pk)s (%(name)s) can never start as the pool is now"),
)
JOB_QUEUED_BUT_CAN_NO = Message(
    "scheduler.job_queued_but_can_no",
    gettext_noop(
        "Job %(pk)s (%(name)s) of %(tenant)s is queued, but it can no longer ever start: %(sentences)s.\nCancel it "
        "and submit a smaller one, or ask an administrator to add nodes or raise the quota; it stays queued "
        "meanwhile and starts by itself once it fits."
    ),
)
