"""Benchmark: the audit trail's cost per request, its write rate, and verification throughput.

Prints figures, not assertions:
  1. overhead per request: the write service behind an API request (``tenants.services.tenant_create``) timed
     with auditing on and with its ``audit_record`` replaced by a no-op, median over N iterations (a GET of
     the API root through the test client is printed for scale);
  2. records/s written by ``audit_record`` (one transaction per record, the way services call it; and batched
     1,000 per transaction, the way a scheduler cycle writes);
  3. verification throughput (records/s) of ``audit_verify`` over the whole trail (default 100,000 records),
     with and without opening every record's seal, and of the offline bundle verifier.

The database is a fresh SQLite file in a temporary directory unless ``--database-url`` (or
GPUPOOL_DATABASE_URL) names another (use an empty PostgreSQL database: the benchmark migrates it).

    .venv/bin/python benchmarks/audit.py                 # 100,000 records
    .venv/bin/python benchmarks/audit.py --records 10000 --iterations 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _django import setup_django  # benchmarks/ is on sys.path when a script runs


def _per_call(fn, iterations: int) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records to write and verify")
    parser.add_argument("--iterations", type=int, default=300, help="requests per overhead measurement")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="gpupool-audit-bench-")
    setup_django(args.database_url or None, data_dir)

    from django.db import connection, transaction
    from rest_framework.test import APIClient

    import tenants.services
    from audit.models import AuditRecord
    from audit.services import audit_record, checkpoint_all
    from audit.verification import verify_trail
    from tenants.models import PlatformRole, Tenant, User

    engine = connection.vendor
    print(f"database: {engine} ({connection.settings_dict['NAME']}), cipher: AES-256-GCM, CPU count: {os.cpu_count()}")

    admin = User.objects.create(username="bench-admin", platform_role=PlatformRole.SYSTEM_ADMIN)
    tenant = Tenant.objects.create(name="bench", slug="bench")
    client = APIClient()
    client.force_authenticate(admin)
    counter = iter(range(10**9))

    def api_request() -> None:
        n = next(counter)
        tenants.services.tenant_create(actor=admin, name=f"t{n}", slug=f"t-{n}", kind="team")

    def noop(**kwargs):
        return None

    original = tenants.services.audit_record
    with_audit = _per_call(api_request, args.iterations)
    tenants.services.audit_record = noop
    without_audit = _per_call(api_request, args.iterations)
    tenants.services.audit_record = original
    get_ms = _per_call(lambda: client.get("/api/v1/"), min(args.iterations, 100)) * 1000
    print(
        f"service request (tenant_create, {args.iterations} iterations, median): with audit "
        f"{with_audit * 1000:.2f} ms, without {without_audit * 1000:.2f} ms, overhead "
        f"{(with_audit - without_audit) * 1000:.2f} ms per request (for scale: GET /api/v1/ takes {get_ms:.2f} ms)"
    )
    operator_cost = _per_call(
        lambda: audit_record(action="quota.update", actor=admin, tenant=tenant, target="q", details={"a": 1}),
        args.iterations,
    )
    print(
        f"one operator action on a tenant object (2 records: tenant + platform stream): {operator_cost * 1000:.2f} ms"
    )

    # Records/s: one transaction each, then batched.
    single = min(args.records // 10, 5000)
    start = time.perf_counter()
    for n in range(single):
        audit_record(action="job.submit", actor=None, tenant=n % 10 + 1000, target=f"job:{n}", details={"n": n})
    elapsed = time.perf_counter() - start
    print(f"write, one transaction per record: {single / elapsed:,.0f} records/s ({single:,} records)")
    remaining = args.records - AuditRecord.objects.count()
    batch = 1000
    start = time.perf_counter()
    written = 0
    while written < remaining:
        with transaction.atomic():
            for _ in range(min(batch, remaining - written)):
                audit_record(
                    action="job.transition",
                    actor=None,
                    tenant=written % 10 + 1000,
                    target=f"job:{written}",
                    details={"from": "queued", "to": "running"},
                )
                written += 1
        if written % 10000 < batch:
            checkpoint_all()
    elapsed = time.perf_counter() - start
    print(f"write, {batch} records per transaction: {written / elapsed:,.0f} records/s ({written:,} records)")
    checkpoint_all()

    total = AuditRecord.objects.count()
    start = time.perf_counter()
    report = verify_trail(record_result=False, check_seals=False)
    elapsed = time.perf_counter() - start
    print(
        f"verify (hash chains + checkpoints), {total:,} records: {total / elapsed:,.0f} records/s "
        f"({elapsed:.1f} s, ok={report.ok})"
    )
    start = time.perf_counter()
    report = verify_trail(record_result=False, check_seals=True)
    elapsed = time.perf_counter() - start
    print(
        f"verify (+ open every seal), {total:,} records: {total / elapsed:,.0f} records/s "
        f"({elapsed:.1f} s, ok={report.ok})"
    )

    import datetime as dt

    from django.utils import timezone

    from audit.exports import build_bundle
    from audit.verify import verify_bundle

    start = time.perf_counter()
    body, _manifest = build_bundle(
        actor=None, start=timezone.now() - dt.timedelta(days=1), end=timezone.now() + dt.timedelta(days=1)
    )
    export_s = time.perf_counter() - start
    path = Path(data_dir) / "bundle.zip"
    path.write_bytes(body)
    start = time.perf_counter()
    summary = verify_bundle(str(path))
    offline_s = time.perf_counter() - start
    print(
        f"export bundle of {summary['records']:,} records: {export_s:.1f} s ({len(body) / 1e6:.1f} MB); offline "
        f"verifier: {summary['records'] / offline_s:,.0f} records/s"
    )


if __name__ == "__main__":
    main()
