"""Writes for tenants, users, memberships, API tokens, quotas and approvals, one module per domain. Every
state change goes through a function here, so the console, the API and management commands share one set of
rules and one audit trail. Import from the module that owns the domain; this package re-exports nothing.

Services take keyword-only arguments, run in one transaction, check that ``actor`` may do the change
(``actor=None`` is the system itself: demo data, bootstrap, migrations) and write an audit record with the
before/after values. Callers resolve objects through ``tenants.selectors`` first, so an object the actor
cannot see is already a 404 before a service is reached.

Rooms:

- ``identity``: users, platform roles, passwords, two-factor sign-in (TOTP), sign-in events and lockouts.
- ``tenancy``: the tenant tree: create, update (rename, move, archive) and delete, with the cycle checks.
- ``memberships``: who belongs to which tenant, in which role.
- ``tokens``: API tokens: mint, revoke, authenticate.
- ``quotas``: quotas per tenant and flavor, checked against the tree; showback prices per flavor.
- ``approvals``: the approval inbox (quota changes, job admissions): chains, requests, decisions, expiry.
- ``admissions``: whether a job waits for approval, its admission request, the tenant's threshold.
- ``notifications``: who is told about an approval, queueing, sending and retrying the deliveries.
- ``guards``: the write guard and the permission check every service runs first.
"""
