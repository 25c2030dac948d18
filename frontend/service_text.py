"""The services' refusals in the reader's language, wherever the console shows them.

The services (and the job spec's validation) write their messages in English with the data in them, for the API,
the CLI and the audit trail alike (as the scheduler writes its sentences; ``scheduler.message_text`` localizes
those). The console shows them at a form field or as a page message; ``localize`` recognises such a message by
its pattern and formats the translated template with the message's own data. A message no pattern knows stays as
it was; tests/frontend/test_service_text.py walks the services' source and fails on a refusal without a pattern.
"""

from __future__ import annotations

import re

from django.utils.translation import gettext, gettext_noop

from scheduler import message_text as scheduler_text
from scheduler.models import JobKind, JobState
from tenants.models import ApprovalStatus, ApprovalStepRole

_SLUG = r"[\w.-]+"
_INT = r"-?\d+"

# What a placeholder's data look like, by its name; any other name stands for any text (the words around it keep
# the pattern precise, and a pattern must match the whole message).
_GROUPS = {
    "flavor": _SLUG,
    "total": r"\d+",
    "guaranteed": r"\d+",
    "limit": r"\d+",
    "where": r"[\w./-]+",
    "role": r"[a-z ]+",
    "pk": r"\d+",
    "n": r"\d+",
    "max": r"\d+",
    "low": _INT,
    "high": _INT,
    "step": r"\d+",
    "depth": _INT,
    "height": r"\d+",
    "days": r"\d+",
    "ttl": _INT,
    "least": r"\d+",
    "most": r"\d+",
    "jobs": r"[\d,]+",
    "cap": r"[\d,]+",
    "state": r"\w+",
    "to_state": r"\w+",
    "status": r"\w+",
    "job_kind": r"\w+",
    "type": r"\w+",
    # a job spec field path: resources.gpus, env.MY_VAR, command[3], or a field the user sent (no colon)
    "field": r"[^:]+?",
    "setting": r"\w+",  # a what-if setting: grace_period_s
}


def _pattern(template: str) -> tuple[re.Pattern[str], str]:
    """(the pattern of the messages ``template`` writes, ``template``): its words as they are, each placeholder
    as the data ``_GROUPS`` says it holds, a placeholder used again as the same text."""
    parts = re.split(r"%\((\w+)\)s", template)
    regex, seen = [], set()
    for index, part in enumerate(parts):
        if index % 2 == 0:
            regex.append(re.escape(part))
        elif part in seen:
            regex.append(f"(?P={part})")
        else:
            seen.add(part)
            regex.append(f"(?P<{part}>{_GROUPS.get(part, '.+?')})")
    return re.compile("".join(regex), re.DOTALL), template


# (the whole message, its English template with the same named groups). The template is the msgid. Where two
# templates could both match a message the more specific one comes first.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    _pattern(template)
    for template in (
        gettext_noop(
            "Quota for %(flavor)s: the guarantees under %(parent)s add up to %(total)s millis (%(parts)s) but "
            "%(parent)s is guaranteed only %(guaranteed)s; raise %(parent)s's guarantee or lower the others."
        ),
        gettext_noop(
            "Quota %(where)s: limit_millis %(limit)s is below guaranteed_millis %(guaranteed)s; the limit must be "
            "at least the guarantee."
        ),
        gettext_noop("This step waits for a %(role)s; a system admin deciding it instead must say why (comment)."),
        gettext_noop("This account is deactivated."),
        gettext_noop("Auditors have read-only access; ask a system or security admin."),
        gettext_noop("Only a security admin may create accounts."),
        gettext_noop("Only a security admin may change accounts."),
        gettext_noop("Only a security admin may grant or remove platform roles."),
        gettext_noop("Only a security admin may set another's password."),
        gettext_noop("Only a security admin may reset another account's two-factor devices."),
        gettext_noop("Only a security admin may lift a sign-in lockout."),
        gettext_noop("You can only enrol a two-factor device for your own account."),
        gettext_noop("This device belongs to another account."),
        gettext_noop("That code is not valid; check the clock of your device and try again."),
        gettext_noop("You cannot deactivate your own account; ask another security admin."),
        gettext_noop("You cannot change your own platform role; ask another security admin."),
        gettext_noop("Unknown platform role '%(value)s'; use one of: %(choices)s"),
        gettext_noop("Unknown platform role '%(value)s'."),
        gettext_noop("A user named '%(name)s' already exists; choose another username."),
        gettext_noop(
            "%(user)s is a member of tenants; a platform account holds no tenant membership. Remove the "
            "memberships first (or use a separate account for the platform role)."
        ),
        gettext_noop(
            "%(user)s already holds the platform role '%(before)s'; one account cannot hold two platform roles. "
            "Remove '%(before)s' first, then grant '%(after)s'."
        ),
        gettext_noop(
            "That user cannot be added: the account does not exist, is deactivated, or is a platform account "
            "(platform accounts hold no tenant membership)."
        ),
        gettext_noop("Unknown role '%(value)s'; use one of: %(choices)s"),
        gettext_noop("Only a tenant admin of '%(tenant)s' may add members to it."),
        gettext_noop("Only a tenant admin of '%(tenant)s' may change its members' roles."),
        gettext_noop("Only a tenant admin of '%(tenant)s' may remove its members."),
        gettext_noop("%(user)s is already a member of %(tenant)s."),
        gettext_noop("Only platform admins retry notifications."),
        gettext_noop("Notification %(pk)s was already sent."),
        gettext_noop("Unknown quota field(s): %(fields)s."),
        gettext_noop("Only a system admin sets quotas directly; tenant admins request a change."),
        gettext_noop("Only a system admin sets prices."),
        gettext_noop("price_per_device_hour must be ≥ 0."),
        gettext_noop("price_per_device_hour must be a number."),
        gettext_noop("%(quota_field)s must be a whole number ≥ 0 (got %(value)s)."),
        gettext_noop("%(quota_field)s must be a multiple of %(step)s (1000 millis = one card); got %(value)s."),
        gettext_noop("Only a system admin sets the job approval threshold."),
        gettext_noop("The threshold must be ≥ 0 millis."),
        gettext_noop("Only a tenant admin of '%(tenant)s' may request a quota change for it."),
        gettext_noop("You cannot approve this step: it waits for a %(role)s, and nobody approves their own request."),
        gettext_noop("Only the requester may resubmit a request."),
        gettext_noop("Only the requester may cancel this request."),
        gettext_noop("GPUPOOL_APPROVAL_CHAINS[%(kind)s] has unknown role(s) %(roles)s."),
        gettext_noop(
            "Nobody but you could approve this request: as a system admin, set the quota directly (POST "
            "/api/v1/quotas/)."
        ),
        gettext_noop("Request #%(pk)s is %(status)s; nothing more can be decided on it."),
        gettext_noop("You are not the approver this request is waiting for."),
        gettext_noop("Say why you reject the request (comment)."),
        gettext_noop("A job admission can be approved or rejected, not sent back for changes."),
        gettext_noop("Say which changes you need (comment)."),
        gettext_noop("A tenant named '%(name)s' already exists at the top level; choose another name."),
        gettext_noop("A tenant named '%(name)s' already exists under '%(parent)s'; choose another name."),
        gettext_noop("Unknown tenant kind '%(value)s'."),
        gettext_noop("Tenant '%(tenant)s' would be at depth %(depth)s; the tree allows at most %(max)s levels."),
        gettext_noop("A tenant with slug '%(tenant)s' already exists."),
        gettext_noop("Only a tenant admin of '%(tenant)s' may change it."),
        gettext_noop("Deleting '%(tenant)s' needs tenant admin rights on its parent (or a system admin)."),
        gettext_noop("Tenant '%(tenant)s' has child tenants; move or delete them first."),
        gettext_noop("Tenant '%(tenant)s' still has members; remove their memberships first."),
        gettext_noop("Tenant '%(tenant)s' still has jobs, quotas or other records; remove those first."),
        gettext_noop("Only a system admin may create a top-level tenant."),
        gettext_noop("Only a tenant admin of '%(tenant)s' may add tenants to it."),
        gettext_noop("Moving '%(tenant)s' needs tenant admin rights on its parent tenant."),
        gettext_noop("Only a system admin may move a tenant to the top level."),
        gettext_noop("You are not a tenant admin of '%(tenant)s'."),
        gettext_noop(
            "Cannot move '%(tenant)s' under '%(parent)s': '%(parent)s' is inside the subtree of '%(tenant)s', "
            "which would make a cycle."
        ),
        gettext_noop(
            "Cannot move '%(tenant)s' under 'the top level': its subtree has %(height)s level(s) and would reach "
            "depth %(depth)s; the tree allows at most %(max)s."
        ),
        gettext_noop(
            "Cannot move '%(tenant)s' under '%(parent)s': its subtree has %(height)s level(s) and would reach "
            "depth %(depth)s; the tree allows at most %(max)s."
        ),
        gettext_noop("Unknown scope '%(value)s'; use read, write or admin."),
        gettext_noop("Only system and security admins may create admin-scoped tokens."),
        gettext_noop("Auditors may only create read-scoped tokens."),
        gettext_noop("expires_at must be in the future."),
        gettext_noop("Tokens live at most %(days)s days; pick an earlier expires_at."),
        gettext_noop("You already have a token named '%(name)s'."),
        gettext_noop("Only the owner or a security admin may revoke it."),
        gettext_noop("No tenant '%(tenant)s' is visible to you."),
        gettext_noop(
            "You may not submit jobs to %(tenant)s: members and tenant admins may; ask a tenant admin for the "
            "member role."
        ),
        gettext_noop("tenant: say which tenant the job belongs to."),
        gettext_noop(
            'tenant: you belong to several tenants (or none that may submit); name one with "tenant": "<slug>".'
        ),
        gettext_noop("Only the submitter, a tenant admin or a system admin may cancel this job."),
        gettext_noop("Only the submitter, a tenant admin or a system admin may cancel this array."),
        gettext_noop("Only the submitter, a tenant admin or a system admin may scale this job."),
        gettext_noop('array: say how many jobs to create, e.g. "array": {"count": 100}.'),
        gettext_noop("No job array %(pk)s."),
        gettext_noop("No job with id %(pk)s."),
        gettext_noop("No tenant with id %(pk)s is visible to you."),
        gettext_noop("No user with id %(pk)s is visible to you."),
        gettext_noop("No API token with id %(pk)s is visible to you."),
        gettext_noop("No approval request with id %(pk)s is visible to you."),
        gettext_noop("No sign-in lockout with id %(pk)s is visible to you; it may have expired."),
        gettext_noop("No job with id %(pk)s is visible to you."),
        gettext_noop("No job array %(pk)s is visible to you."),
        gettext_noop("No node with id %(pk)s."),
        gettext_noop("Job %(pk)s is already %(state)s; there is nothing to cancel."),
        gettext_noop("Job %(pk)s is %(state)s, not waiting for approval."),
        gettext_noop("Job %(pk)s is %(state)s; there is nothing to scale."),
        gettext_noop("Job %(pk)s is %(state)s; it cannot become %(to_state)s."),
        gettext_noop("A new job cannot start %(to_state)s."),
        gettext_noop("Job %(pk)s is a %(job_kind)s job; only inference services scale."),
        gettext_noop(
            "replicas: must be between min_replicas (%(least)s) and max_replicas (%(most)s); submit the service "
            "with a larger max_replicas to scale further."
        ),
        gettext_noop("Only a system admin may change nodes and flavors."),
        gettext_noop("A flavor named '%(name)s' already exists."),
        gettext_noop("Only a system admin may re-home a device."),
        gettext_noop(
            "Device %(device)s still holds a running allocation; drain node %(node)s or cancel the job first."
        ),
        gettext_noop("ttl must be between 60 seconds and %(days)s days; got %(ttl)s seconds."),
        gettext_noop("A job spec must be a JSON object."),
        gettext_noop(
            "checkpoint_dir: '%(path)s' is not under a checkpoint prefix of tenant %(tenant)s (none are configured "
            "for it: use a relative path (in the job dir)); an administrator sets them in "
            "GPUPOOL_CHECKPOINT_PREFIXES."
        ),
        gettext_noop(
            "checkpoint_dir: '%(path)s' is not under a checkpoint prefix of tenant %(tenant)s (%(prefixes)s); an "
            "administrator sets them in GPUPOOL_CHECKPOINT_PREFIXES."
        ),
        gettext_noop("resources.flavors: unknown flavor '%(flavor)s'; known flavors: none are defined yet."),
        gettext_noop("resources.flavors: unknown flavor '%(flavor)s'; known flavors: %(known)s."),
        gettext_noop("%(field)s: must be a whole number between %(low)s and %(high)s, got %(value)s."),
        gettext_noop("%(field)s: must be between %(low)s and %(high)s, got %(value)s."),
        gettext_noop("%(field)s: must be a string, got %(type)s (quote numbers)."),
        gettext_noop("%(field)s: must be a string, got %(type)s."),
        gettext_noop("%(field)s: is required and must not be empty."),
        gettext_noop("%(field)s: must be at most %(max)s characters, got %(n)s."),
        gettext_noop("%(field)s: must be at most %(max)s characters without NUL bytes."),
        gettext_noop("%(field)s: must be one of %(choices)s; got %(value)s."),
        gettext_noop("%(field)s: must be an object of strings, e.g. %(example)s."),
        gettext_noop("%(field)s: may hold at most %(max)s entries, got %(n)s."),
        gettext_noop("%(field)s: keys must be non-empty strings of at most %(max)s characters."),
        gettext_noop("%(field)s: is not a known field; allowed: %(allowed)s."),
        gettext_noop("%(field)s: must not contain a NUL byte."),
        gettext_noop("%(field)s: must be a relative path inside the job's directory, without '..', e.g. src/train."),
        gettext_noop("%(field)s: an absolute path must be plain: no '..', no backslash, e.g. /ckpt/acme/resnet50."),
        gettext_noop("env: may hold at most %(max)s variables, got %(n)s."),
        gettext_noop(
            "env: variable '%(key)s' is not a valid name; names are letters, digits and '_', not starting with a "
            "digit (e.g. MY_VAR)."
        ),
        gettext_noop(
            "env: variable '%(key)s' contains '='; names are letters, digits and '_', not starting with a digit "
            "(e.g. MY_VAR)."
        ),
        gettext_noop(
            "env: variable '%(key)s' contains a NUL byte; names are letters, digits and '_', not starting with a "
            "digit (e.g. MY_VAR)."
        ),
        gettext_noop("%(field)s: the name must be at most %(max)s characters."),
        gettext_noop("%(field)s: the value must not contain a NUL byte."),
        gettext_noop("%(field)s: the value must be at most %(max)s characters, got %(n)s."),
        gettext_noop("%(field)s: GPUPOOL_* and CUDA_* are set by the platform; remove it."),
        gettext_noop(
            "%(field)s: %(name)s may not be set by a job: it steers the loader or libc of every process the job "
            "starts, or the platform's search path (denied: %(denied)s). Use absolute paths in command, or set it "
            "inside your own script."
        ),
        gettext_noop('array: must be an object with a count, e.g. "array": {"count": 100}.'),
        gettext_noop('array.count: is required: how many jobs to create, e.g. "array": {"count": 100}.'),
        gettext_noop('resources: is required: e.g. {"flavors": ["nvidia-h100-80g"], "gpus": 1}.'),
        gettext_noop("resources.flavors: give either flavor or flavors, not both."),
        gettext_noop("resources.flavors: must be a non-empty list of flavor names (any of them will do)."),
        gettext_noop("resources.flavors: may name at most %(max)s flavors."),
        gettext_noop(
            'resources: ask for whole cards with "gpus": N, or a fraction of one card with "millis" (100..990) and '
            '"memory_mib".'
        ),
        gettext_noop("resources.millis: must be a multiple of %(step)s (1/100 card), got %(value)s."),
        gettext_noop("resources.memory_mib: is required for a fractional card: say how much device memory."),
        gettext_noop("resources.cpu_cores: must be a number between 0 and %(max)s."),
        gettext_noop("resources.any_flavor: must be true or false."),
        gettext_noop("tenant: must be a tenant slug."),
        gettext_noop("preemptible: must be true or false."),
        gettext_noop("min_replicas: min_replicas and max_replicas apply to inference jobs only."),
        gettext_noop("min_replicas: must not exceed replicas (%(n)s)."),
        gettext_noop("max_replicas: must be at least replicas (%(n)s)."),
        gettext_noop('command: must be a non-empty list of strings, e.g. ["python", "train.py"].'),
        gettext_noop("command: may hold at most %(max)s arguments."),
        gettext_noop("command[0]: the program to run must not be empty."),
        gettext_noop("image: must be an OCI image reference, e.g. docker.io/pytorch/pytorch:2.3.0-cuda12.1."),
        gettext_noop("node_selector: a job with an image needs %(label)s=true; remove that selector."),
        gettext_noop("Only a system admin may run a what-if."),
        gettext_noop("say what to change, e.g. preemption=false"),
        gettext_noop("no job ran between %(since)s and %(until)s; choose a longer window"),
        gettext_noop(
            "the window holds %(jobs)s jobs, more than the %(cap)s a web request replays; choose fewer days, or "
            "run `gpupool whatif` on the server"
        ),
        gettext_noop("Only a system admin may export the job history."),
        gettext_noop("unknown format '%(value)s'; use one of %(choices)s"),
        gettext_noop("days must be more than 0 and at most %(max)s"),
        gettext_noop("the window starts before the year 1; choose a later until"),
        gettext_noop("since must be before until"),
        gettext_noop("the window is longer than %(max)s days; export it in parts"),
        gettext_noop("The records are not covered by a checkpoint yet; try again in a moment."),
        gettext_noop("%(stream)s: the witness's latest checkpoint is not in the database; run audit_verify."),
        gettext_noop("The witness cannot be read (%(error)s); an export must carry its statement."),
        gettext_noop("The export range is empty: 'to' must be after 'from'."),
        # an approval request's result (approval_detail.html, |service_text)
        gettext_noop("Applied."),
        gettext_noop("The job is queued."),
        gettext_noop("Rejected by %(user)s."),
        gettext_noop("Nobody decided in time."),
        gettext_noop("Approved, but it no longer fits: %(reason)s"),
        gettext_noop("the job spec contains a NUL character (\\u0000); remove it and send the request again."),
        gettext_noop(
            "the job spec (at %(path)s) contains a NUL character (\\u0000); remove it and send the request again."
        ),
        gettext_noop("a key of the job spec contains a NUL character (\\u0000); remove it and send the request again."),
        gettext_noop(
            "a key of the job spec (at %(path)s) contains a "
            "NUL character (\\u0000); remove it and send the request again."
        ),
        gettext_noop("the job spec nests objects and arrays more than %(max)s levels deep; send a flatter document."),
        gettext_noop("%(pair)s: expected NAME=VALUE with NAME one of %(names)s"),
        gettext_noop("unknown setting '%(unknown)s'; the settings are %(names)s"),
        gettext_noop("%(setting)s: expected true or false, got %(value)s"),
        gettext_noop("%(setting)s: expected a number or none, got %(value)s"),
        gettext_noop("%(setting)s: expected a number, got %(value)s"),
        gettext_noop("%(setting)s: expected a number of at least 0, got %(value)s"),
        gettext_noop("%(setting)s: expected a whole number, got %(value)s"),
        gettext_noop("%(setting)s: expected one of %(choices)s, got %(value)s"),
        # named ports, launchers, shared storage, outputs (issues 30 and 31)
        gettext_noop("%(field)s: %(value)s is named twice; give each port its own name."),
        gettext_noop(
            "%(field)s: must be 1-15 lower-case letters, digits or '-', starting with a letter (not 'replica' or "
            "'rendezvous'), e.g. http."
        ),
        gettext_noop("%(field)s: must be a URL path starting with '/', e.g. /health."),
        gettext_noop("%(field)s: unknown field; a port has %(fields)s."),
        gettext_noop('%(field)s: must be an object such as {"name": "http"}.'),
        gettext_noop("ports: at most %(n)s named ports."),
        gettext_noop('ports: must be a list such as [{"name": "http", "ready_path": "/health"}].'),
        gettext_noop("launcher: must be one of %(choices)s, not %(value)s."),
        gettext_noop(
            "checkpoint_dir: %(value)s is on the shared storage, where each job gets its own checkpoint dir: give a "
            "relative checkpoint_dir (or none) and the job gets <shared>/tenants/<tenant>/jobs/<job>/<it>."
        ),
        gettext_noop("Node %(node)s never ran replica %(replica)s of job %(job)s."),
        gettext_noop("the output is over GPUPOOL_OUTPUT_MAX_BYTES (%(n)s bytes)."),
        gettext_noop("the upload does not match its sha256; send it again."),
        # A job the pool or its quota tree can never give what it asks (scheduler.core.feasibility): the bounds
        # and the fix are the scheduler's sentences (scheduler.message_text).
        gettext_noop("%(field)s: never fits: %(sentences)s; %(fix)s."),
    )
]

# Data the services write as stored values, shown as their labels in the active language.
_LABELS: dict[str, dict[str, object]] = {
    # an approver role as the services write it in a sentence (the stored value with spaces)
    "role": {role.value.replace("_", " "): role.label for role in ApprovalStepRole},
    "state": {state.value: state.label for state in JobState},
    "to_state": {state.value: state.label for state in JobState},
    "status": {status.value: status.label for status in ApprovalStatus},
    "job_kind": {kind.value: kind.label for kind in JobKind},
}


def localize(message: str) -> str:
    """``message`` in the active language when a pattern knows it, else as it is."""
    for pattern, template in PATTERNS:
        match = pattern.fullmatch(message)
        if match:
            data = {
                name: str(_LABELS[name].get(value, value)) if name in _LABELS else value
                for name, value in match.groupdict().items()
            }
            if "reason" in data:  # a service's refusal quoted in a result ("Approved, but it no longer fits: ...")
                data["reason"] = localize(data["reason"])
            for name in ("sentences", "fix"):  # the scheduler's own sentences, in its own patterns
                if name in data:
                    data[name] = scheduler_text.localize(data[name])
            return gettext(template) % data
    return message
