"""The audit trail is deliberately not in the Django admin: the admin is for system and security admins, who
must not read or change audit records (separation of duties). Auditors use /api/v1/audit/ and the console."""
