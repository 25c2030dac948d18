#!/bin/sh
# One-shot, as the database owner: bring the schema up to date, (re)create the portal's restricted role with its
# password, and create the first admins when their variables are set. Idempotent: `docker compose up` runs it
# every time, before any other gpupool process starts.
set -eu

gpupool migrate --noinput
# The role web, worker and beat connect as: INSERT and SELECT on the audit tables, never UPDATE/DELETE/TRUNCATE
# (docs/audit.md). Its password comes from PORTAL_DB_PASSWORD in deploy/.env.
gpupool db_roles --login
gpupool shell --no-startup --command "
import os
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute('ALTER ROLE gpupool_portal PASSWORD %s', [os.environ['PORTAL_DB_PASSWORD']])
"
if [ -n "${GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN:-}${GPUPOOL_BOOTSTRAP_SECURITY_ADMIN:-}" ]; then
    gpupool bootstrap
fi
echo "migrate: schema, roles and admins ready"
