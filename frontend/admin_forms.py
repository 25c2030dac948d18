"""Forms of the self-service and admin pages (API tokens, accounts and roles, tenants and quotas).

They check the shape of the input only; every rule (who may, which scope, which parent, which numbers) is the
service's, and a service's refusal is shown at the field it names (``attach_domain_error``).
"""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Exists, OuterRef, QuerySet
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from frontend.forms import QuotaChangeForm
from frontend.service_text import localize
from kernel.access_rules import TOKEN_SCOPE, Action
from kernel.api import DomainError
from tenants.models import MembershipRole, PlatformRole, TenantKind, TokenScope, User
from tenants.services.tokens import TOKEN_DEFAULT_LIFETIME_DAYS, TOKEN_MAX_LIFETIME_DAYS


def attach_domain_error(form: forms.Form, exc: DomainError, aliases: dict[str, str] | None = None) -> None:
    """Show a service's message next to the field it names (``aliases`` maps service fields to form fields),
    or above the form when the form has no such field."""
    field = (aliases or {}).get(exc.field or "", exc.field or "")
    form.add_error(field if field in form.fields else None, localize(exc.message))


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        label=_("Name"), max_length=100, help_text=_("Say where it is used, e.g. “laptop CLI” or “CI pipeline”.")
    )
    scope = forms.ChoiceField(
        label=_("Scope"),
        help_text=_(
            "gpupool-cli needs write to submit and cancel jobs; a read token can only look (jobs, logs, quotas)."
        ),
    )
    lifetime_days = forms.IntegerField(
        label=_("Valid for (days)"),
        min_value=1,
        max_value=TOKEN_MAX_LIFETIME_DAYS,
        initial=TOKEN_DEFAULT_LIFETIME_DAYS,
    )

    SCOPE_LABELS = {
        TokenScope.READ: _("read — look only"),
        TokenScope.WRITE: _("write — also submit and cancel jobs, request quota"),
        TokenScope.ADMIN: _("admin — also platform operations of your role"),
    }

    def __init__(self, *args, scopes: list[str], **kwargs) -> None:
        """``scopes``: those the signed-in person's role allows (``tenants.permissions.token_scopes_allowed``)."""
        super().__init__(*args, **kwargs)
        self.fields["scope"].choices = [(scope, self.SCOPE_LABELS[scope]) for scope in scopes]
        # Preselected: the scope the CLI's everyday use needs (submitting a job), where the role offers it. With
        # no default the browser picked the first, read, and a token made that way could not submit.
        everyday = TOKEN_SCOPE[Action.JOB_SUBMIT]
        self.fields["scope"].initial = everyday if everyday in scopes else scopes[0]
        # Formatted per request, in the page's language (a lazy string formatted at import would stay English).
        self.fields["lifetime_days"].help_text = gettext("Tokens always expire; at most %(days)s days.") % {
            "days": TOKEN_MAX_LIFETIME_DAYS
        }


# --- accounts and roles (security admins) -------------------------------------------------------------------


class UserCreateForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    email = forms.EmailField(label=_("E-mail"), required=False)
    first_name = forms.CharField(label=_("First name"), max_length=150, required=False)
    last_name = forms.CharField(label=_("Last name"), max_length=150, required=False)
    platform_role = forms.ChoiceField(label=_("Platform role"), choices=PlatformRole.choices, required=False)
    password = forms.CharField(
        label=_("Initial password"),
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        required=False,
        help_text=_("Leave empty for an account that signs in only through single sign-on."),
    )

    def service_kwargs(self) -> dict:
        data = self.cleaned_data
        return {
            "username": data["username"],
            "email": data["email"],
            "first_name": data["first_name"],
            "last_name": data["last_name"],
            "platform_role": data["platform_role"] or PlatformRole.NONE,
            "password": data["password"] or None,
        }


class PlatformRoleForm(forms.Form):
    platform_role = forms.ChoiceField(label=_("Platform role"), choices=PlatformRole.choices, required=False)


class MembershipAddForm(forms.Form):
    tenant = forms.ChoiceField(label=_("Tenant"))
    role = forms.ChoiceField(label=_("Role"), choices=MembershipRole.choices, initial=MembershipRole.MEMBER)

    def __init__(self, *args, tenants: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = tenants


class MembershipRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=MembershipRole.choices)


class UserFilterSet(django_filters.FilterSet):
    """The security admin's account list: search, role, active, two-factor, locked out."""

    q = django_filters.CharFilter(method="search", label=_("Search"))
    platform_role = django_filters.ChoiceFilter(
        choices=[(value, label) for value, label in PlatformRole.choices if value] + [("none", _("none"))],
        method="filter_role",
        label=_("Platform role"),
        empty_label=_("any"),
    )
    is_active = django_filters.BooleanFilter(
        label=_("Active"), widget=forms.Select(choices=[("", _("any")), ("true", _("yes")), ("false", _("no"))])
    )
    has_mfa = django_filters.BooleanFilter(
        label=_("Two-factor"), widget=forms.Select(choices=[("", _("any")), ("true", _("yes")), ("false", _("no"))])
    )
    is_locked = django_filters.BooleanFilter(
        label=_("Locked out"), widget=forms.Select(choices=[("", _("any")), ("true", _("yes")), ("false", _("no"))])
    )

    class Meta:
        model = User
        fields = ["q", "platform_role", "is_active", "has_mfa", "is_locked"]

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        from django.db.models import Q

        return queryset.filter(
            Q(username__icontains=value)
            | Q(email__icontains=value)
            | Q(first_name__icontains=value)
            | Q(last_name__icontains=value)
        )

    def filter_role(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(platform_role=PlatformRole.NONE if value == "none" else value)


def annotate_account_state(queryset: QuerySet, lockouts: QuerySet) -> QuerySet:
    """Add ``has_mfa`` (a confirmed two-factor device) and ``is_locked`` (a current lockout of the username) so
    the list can show and filter them in one query."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return queryset.annotate(
        has_mfa=Exists(TOTPDevice.objects.filter(user=OuterRef("pk"), confirmed=True)),
        is_locked=Exists(lockouts.filter(locked=True, username=OuterRef("username"))),
    )


# --- tenants and quotas -------------------------------------------------------------------------------------

TOP_LEVEL = ""


def tenant_path_labels(tenants: list) -> dict[int, str]:
    """Tenant id → its path by name ("Acme / Research / Vision (vision)"), for pickers that must not make
    people type ids. ``tenants`` must hold every ancestor of every tenant in it (a visible subtree does)."""
    by_pk = {tenant.pk: tenant for tenant in tenants}
    labels = {}
    for tenant in tenants:
        names, node = [], tenant
        while node is not None:
            names.append(node.name)
            node = by_pk.get(node.parent_id)
        labels[tenant.pk] = f"{' / '.join(reversed(names))} ({tenant.slug})"
    return labels


def tenant_choices(tenants: list) -> list[tuple[str, str]]:
    """(id, path) pairs sorted by path: a tenant's children follow it."""
    labels = tenant_path_labels(tenants)
    return sorted(((str(pk), label) for pk, label in labels.items()), key=lambda choice: choice[1].lower())


class TenantForm(forms.Form):
    """Create (all fields) or change (no slug) a tenant. ``parents``: (id, path) of the tenants the person may
    put it under, plus ``("", "top level")`` where they may create or move to the top."""

    name = forms.CharField(label=_("Name"), max_length=100)
    slug = forms.SlugField(
        label=_("Short name (slug)"),
        max_length=100,
        help_text=_("Letters, digits and hyphens; used in job specs and the CLI. It cannot be changed later."),
    )
    kind = forms.ChoiceField(label=_("Kind"), choices=TenantKind.choices, initial=TenantKind.TEAM)
    parent = forms.ChoiceField(label=_("Parent tenant"), required=False)
    description = forms.CharField(
        label=_("Description"), widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, required=False
    )

    def __init__(self, *args, parents: list[tuple[str, str]] | None, with_slug: bool = True, **kwargs) -> None:
        """``parents`` None: the person may not move the tenant, so the field is left out."""
        super().__init__(*args, **kwargs)
        if not with_slug:
            del self.fields["slug"]
        if parents is None:
            del self.fields["parent"]
        else:
            self.fields["parent"].choices = parents


class QuotaSetForm(QuotaChangeForm):
    """A quota set directly by a system admin: the request form's numbers, without the reason."""

    reason = None

    # The service's field names → this form's fields, so its messages appear at the right input.
    SERVICE_FIELD_ALIASES = {
        "guaranteed_millis": "guaranteed_cards",
        "limit_millis": "limit_cards",
        "lending_limit_millis": "lending_limit_cards",
        "guaranteed_memory_mib": "guaranteed_memory_gib",
        "max_running_jobs": "max_running_jobs",
    }


class FlavorPriceForm(forms.Form):
    """The price of one card-hour of a flavor (``tenants.services.quotas.flavor_price_set`` checks the rest)."""

    flavor = forms.ChoiceField(label=_("Flavor"))
    price_per_device_hour = forms.DecimalField(
        label=_("Price per card-hour"), min_value=0, max_digits=12, decimal_places=4
    )
    currency = forms.RegexField(
        label=_("Currency"),
        regex=r"^[A-Za-z]{3}\Z",
        initial="CNY",
        max_length=3,
        help_text=_("Three letters (ISO 4217), e.g. CNY, USD, EUR."),
        error_messages={"invalid": _("Give the currency as three letters, e.g. CNY.")},
    )

    def __init__(self, *args, flavors: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["flavor"].choices = [(name, name) for name in flavors]


class BootstrapTokenForm(forms.Form):
    """A one-time token for enrolling a node (``scheduler.fleet.services.enrolment.bootstrap_token_create``)."""

    node_name = forms.RegexField(
        label=_("Node name"),
        regex=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z",
        required=False,
        help_text=_("Optional: put into the command line below (else the agent uses the node's host name)."),
        error_messages={
            "invalid": _("Letters, digits, “.”, “_” or “-”, starting with a letter or digit (at most 128).")
        },
    )
    ttl_minutes = forms.IntegerField(
        label=_("Valid for (minutes)"),
        min_value=1,
        max_value=30 * 24 * 60,
        help_text=_("The token works once, within this time; use it soon."),
    )
    description = forms.CharField(
        label=_("Note"), max_length=200, required=False, help_text=_("For the audit trail, e.g. the rack or ticket.")
    )
