"""Benchmark: the audit trail's cost per request, its append throughput, the tail window a database administrator
can cut undetected, and verification throughput.

Prints figures, not assertions:
  1. overhead per request: the write service behind an API request (``tenants.services.tenancy.tenant_create``) timed
     with auditing on and with its ``audit_record`` replaced by a no-op, median over N iterations (a GET of
     the API root through the test client is printed for scale);
  2. append throughput under the append-at-commit design (records linked into their per-stream chains just
     before COMMIT): records/s with one record per transaction from 1 thread, from 8 threads on 8 streams and on
     one stream (PostgreSQL only: SQLite serialises writers), and with ``--batch`` records in one transaction;
  3. the tail window: while records are appended at ``--window-rate`` records/s, the checkpoints run as in
     production (a real ``celery worker -B`` whose beat runs ``audit.checkpoint`` every
     GPUPOOL_AUDIT_CHECKPOINT_SECONDS, when Redis is configured; else a thread calling the task's function on that
     interval). Every 100 ms it reads the witness's cosignatures and the database: the records no cosigned checkpoint
     covers are what a DBA could delete (and move the head back over) undetected. Records that matter
     (``audit.events.WITNESS_AT_COMMIT``) are cosigned before their call returns: their commit-to-cosignature
     time is printed too. Prints the maximum, p95 and
     median in seconds and records, and whether the worker's shutdown sealed the tail;
  4. verification throughput (records/s) of ``audit_verify`` over the whole trail, with and without opening every
     record's seal, and of the offline bundle verifier (trust root pinned).

The database is a fresh SQLite file in a temporary directory unless ``--database-url`` (or
GPUPOOL_DATABASE_URL) names another (use an empty PostgreSQL database: the benchmark migrates it).

    .venv/bin/python benchmarks/audit.py                 # 100,000 records
    .venv/bin/python benchmarks/audit.py --records 20000 --iterations 100 --window-seconds 30
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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


def _append_one_per_transaction(tenant_ids: list[int], per_thread: int) -> float:
    """Records/s with one ``audit_record`` per transaction, one thread per entry of ``tenant_ids``."""
    from django.db import connection

    from audit.services import audit_record

    barrier = threading.Barrier(len(tenant_ids) + 1)
    errors: list[BaseException] = []

    def writer(tenant_id: int) -> None:
        try:
            barrier.wait()
            for n in range(per_thread):
                audit_record(action="job.submit", actor=None, tenant=tenant_id, target=f"job:{n}", details={"n": n})
        except BaseException as exc:  # reported below: a failed append is a failed benchmark
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(tenant_id,)) for tenant_id in tenant_ids]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} writer(s) failed: {errors[0]!r}")
    return len(tenant_ids) * per_thread / elapsed


class _WitnessTail:
    """The highest seq of one stream the witness has cosigned (its cosignatures, as the portal stored them)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def witnessed_seq(self) -> int:
        from django.db.models import Max

        from audit.models import Cosignature

        return Cosignature.objects.filter(stream=self.stream).aggregate(top=Max("seq"))["top"] or 0


def _witnessed_at_commit(tenant_id: int, count: int) -> str:
    """How long after its transaction commits a record that matters (``events.WITNESS_AT_COMMIT``) is cosigned."""
    from django.db import transaction

    from audit.models import Cosignature
    from audit.services import audit_record

    samples = []
    for n in range(count):
        start = time.perf_counter()
        with transaction.atomic():
            record = audit_record(action="token.create", actor=None, tenant=tenant_id, target=f"token:{n}")
        if not Cosignature.objects.filter(stream=record.stream, seq__gte=record.seq).exists():
            raise RuntimeError("a record that matters was not cosigned when its transaction returned")
        samples.append(time.perf_counter() - start)
    samples.sort()
    p50_ms, p95_ms = statistics.median(samples) * 1000, samples[int(len(samples) * 0.95)] * 1000
    return (
        f"records that matter (role changes, tokens, exports, key and hold actions): cosigned by the witness before "
        f"the call returns, tail window 0; commit + checkpoint + cosignature p50 {p50_ms:.1f} ms, p95 {p95_ms:.1f} ms"
        f" ({count} records)"
    )


def _start_sealer(use_celery: bool, interval_s: int, data_dir: str):
    """A real ``celery worker -B`` (beat runs ``audit.checkpoint``) or a thread doing what the task does."""
    if use_celery:
        env = {**os.environ, "GPUPOOL_AUDIT_CHECKPOINT_SECONDS": str(interval_s), "GPUPOOL_LOG_LEVEL": "WARNING"}
        argv = [sys.executable, "-m", "celery", "-A", "portal", "worker", "-B", "--pool", "solo", "--loglevel"]
        argv += ["WARNING", "-s", str(Path(data_dir) / "beat-schedule"), "--without-mingle", "--without-gossip"]
        log = open(Path(data_dir) / "worker.log", "wb")  # closed with the process
        return subprocess.Popen(argv, cwd=Path(__file__).resolve().parent.parent, env=env, stdout=log, stderr=log)
    from django.db import connection

    from audit.services import checkpoint_all

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            checkpoint_all()
        connection.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return stop


def _measure_window(args, data_dir: str, tenant_id: int) -> None:
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from audit import conf
    from audit.models import AuditRecord, ChainHead, tenant_stream
    from audit.services import audit_record

    interval_s = conf.checkpoint_every_seconds()
    use_celery = bool(settings.REDIS_URL) and connection.vendor == "postgresql"
    stream = tenant_stream(tenant_id)
    tail = _WitnessTail(stream)
    sealer = _start_sealer(use_celery, interval_s, data_dir)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        pause = 1.0 / args.window_rate
        next_at = time.monotonic()
        while not stop.is_set():
            audit_record(action="job.submit", actor=None, tenant=tenant_id, target="job:w", details={})
            written[0] += 1
            next_at += pause
            time.sleep(max(0.0, next_at - time.monotonic()))
        connection.close()

    try:
        thread = threading.Thread(target=writer)
        thread.start()
        # Warm-up: until the first witnessed checkpoint of the stream (the worker has started, beat has fired).
        deadline = time.monotonic() + 60
        while tail.witnessed_seq() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if tail.witnessed_seq() == 0:
            raise RuntimeError(f"no checkpoint reached the witness within 60 s (see {data_dir}/worker.log)")
        ages: list[float] = []
        counts: list[int] = []
        end = time.monotonic() + args.window_seconds
        while time.monotonic() < end:
            top = tail.witnessed_seq()
            head = ChainHead.objects.filter(stream=stream).values_list("seq", flat=True).first() or 0
            oldest = AuditRecord.objects.filter(stream=stream, seq=top + 1).values_list("created_at", flat=True).first()
            counts.append(max(0, head - top))
            ages.append((timezone.now() - oldest).total_seconds() if oldest and head > top else 0.0)
            time.sleep(0.1)
        stop.set()
        thread.join()
    finally:
        stop.set()
        if use_celery:
            sealer.send_signal(signal.SIGTERM)  # warm shutdown: the worker_shutdown handler seals the tail
            sealer.wait(timeout=60)
        else:
            sealer.set()
    head = ChainHead.objects.get(stream=stream).seq
    sealed = tail.witnessed_seq()
    ages.sort()
    counts.sort()
    how = "celery worker -B (beat: audit.checkpoint)" if use_celery else "a thread calling checkpoint_all()"
    print(
        f"tail window (GPUPOOL_AUDIT_CHECKPOINT_SECONDS={interval_s}, sealed by {how}; {args.window_rate} records/s "
        f"for {args.window_seconds} s, {len(ages)} samples): a DBA can delete undetected at most "
        f"{ages[-1]:.1f} s / {counts[-1]:,} records (p95 {ages[int(len(ages) * 0.95)]:.1f} s / "
        f"{counts[int(len(counts) * 0.95)]:,}, median {statistics.median(ages):.1f} s / "
        f"{statistics.median(counts):,.0f}); audit_verify fails on unwitnessed records older than "
        f"{conf.witness_window_seconds()} s"
    )
    if use_celery:
        print(
            f"worker shutdown (SIGTERM): witness covers seq {sealed} of head {head} "
            f"({'tail sealed' if sealed >= head else f'{head - sealed} records unsealed'})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records to write and verify")
    parser.add_argument("--iterations", type=int, default=300, help="requests per overhead measurement")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--single", type=int, default=2000, help="records per single-record-transaction run")
    parser.add_argument("--batch", type=int, default=10_000, help="records in the one-big-transaction run")
    parser.add_argument("--window-rate", type=int, default=200, help="records/s appended while measuring the window")
    parser.add_argument("--window-seconds", type=int, default=30, help="how long the window is sampled")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="gpupool-audit-bench-")
    setup_django(args.database_url or None, data_dir)

    from django.db import connection, transaction
    from rest_framework.test import APIClient

    import tenants.services.tenancy
    from audit.models import AuditRecord
    from audit.services import audit_record, checkpoint_all
    from audit.trail_verifier import verify_trail
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
        tenants.services.tenancy.tenant_create(actor=admin, name=f"t{n}", slug=f"t-{n}", kind="team")

    def noop(**kwargs):
        return None

    original = tenants.services.tenancy.audit_record
    with_audit = _per_call(api_request, args.iterations)
    tenants.services.tenancy.audit_record = noop
    without_audit = _per_call(api_request, args.iterations)
    tenants.services.tenancy.audit_record = original
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

    # Append throughput under the append-at-commit design.
    rate = _append_one_per_transaction([1000], args.single)
    print(f"append, one record per transaction, 1 thread: {rate:,.0f} records/s ({args.single:,} records)")
    if engine == "postgresql":
        per_thread = max(1, args.single // 8)
        rate = _append_one_per_transaction(list(range(1001, 1009)), per_thread)
        print(f"append, one record per transaction, 8 threads on 8 streams: {rate:,.0f} records/s")
        rate = _append_one_per_transaction([1009] * 8, per_thread)
        print(f"append, one record per transaction, 8 threads on one stream: {rate:,.0f} records/s")
    else:
        print("append from 8 threads: skipped (SQLite serialises writers; use --database-url postgres://…)")
    start = time.perf_counter()
    with transaction.atomic():
        for n in range(args.batch):
            audit_record(action="job.transition", actor=None, tenant=1010, target=f"job:{n}", details={"n": n})
    elapsed = time.perf_counter() - start
    print(f"append, {args.batch:,} records in one transaction: {args.batch / elapsed:,.0f} records/s")
    checkpoint_all()

    _measure_window(args, data_dir, tenant_id=1011)
    print(_witnessed_at_commit(1012, 50))

    # Fill up to --records for the verification figures (1,000 records per transaction).
    remaining = args.records - AuditRecord.objects.count()
    written = 0
    while written < remaining:
        with transaction.atomic():
            for _ in range(min(1000, remaining - written)):
                audit_record(
                    action="job.transition",
                    actor=None,
                    tenant=written % 10 + 1000,
                    target=f"job:{written}",
                    details={"from": "queued", "to": "running"},
                )
                written += 1
        if written % 10000 < 1000:
            checkpoint_all()
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

    from audit.bundle_verifier import verify_bundle
    from audit.exports import build_bundle

    start = time.perf_counter()
    body, _manifest = build_bundle(
        actor=None, start=timezone.now() - dt.timedelta(days=1), end=timezone.now() + dt.timedelta(days=1)
    )
    export_s = time.perf_counter() - start
    path = Path(data_dir) / "bundle.zip"
    path.write_bytes(body)
    start = time.perf_counter()
    summary = verify_bundle(str(path), trust_root=_manifest["trust_root"])
    offline_s = time.perf_counter() - start
    print(
        f"export bundle of {summary['records']:,} records: {export_s:.1f} s ({len(body) / 1e6:.1f} MB); offline "
        f"verifier: {summary['records'] / offline_s:,.0f} records/s"
    )


if __name__ == "__main__":
    main()
