#!/usr/bin/env python3
"""Checks that nothing was lost or counted twice: for every tenant of the
bench reports, the consumption the server stored (its request-unit bucket's
tollgate_tenant_* counters in a /metrics scrape) lies between what the pods
saw confirmed (answered requests) and that plus what they abandoned
unanswered (which the server may or may not have applied). Reports of runs
against the same server add up.

Usage: check-stored-totals.py METRICS_FILE REPORT.json...
Prints one line and exits 0 if every tenant holds, else lists the first
tenants that do not and exits 1.
"""
import json
import re
import sys

COUNTERS = ["read_batches", "read_requests", "read_bytes", "write_batches",
            "write_requests", "write_bytes", "egress_bytes"]
SAMPLE = re.compile(r'^tollgate_tenant_(\w+)_total\{([^}]*)\} (\S+)$')


def stored(path):
    """{tenant: {field: value}} of the request-unit buckets in a scrape."""
    tenants = {}
    with open(path) as f:
        for line in f:
            match = SAMPLE.match(line.strip())
            if not match:
                continue
            field, labels, value = match.groups()
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
            if labels.get("bucket", "") != "":
                continue
            tenants.setdefault(labels["tenant_id"], {})[field] = float(value)
    return tenants


def main():
    scrape, reports = sys.argv[1], [json.load(open(p)) for p in sys.argv[2:]]
    held, failures = 0, []
    tenants = sorted({t for r in reports for t in r["tenants"]})
    store = stored(scrape)
    for tenant in tenants:
        have = store.get(tenant, {})
        for field in COUNTERS + ["request_units"]:
            confirmed = sum(r["tenants"].get(tenant, {}).get("consumption", {}).get(field, 0) for r in reports)
            unconfirmed = sum(r["tenants"].get(tenant, {}).get("unconfirmed", {}).get(field, 0) for r in reports)
            value = have.get(field, 0.0)
            slack = 1e-6 * max(1.0, confirmed + unconfirmed) if field == "request_units" else 0.0
            if not (confirmed - slack <= value <= confirmed + unconfirmed + slack):
                failures.append(f"{tenant}: stored {field} {value} outside [{confirmed}, {confirmed + unconfirmed}]")
        held += 1
    if failures:
        print(f"stored totals: {len(failures)} counters outside what the pods saw, e.g.:")
        for failure in failures[:10]:
            print("  " + failure)
        sys.exit(1)
    print(f"stored totals: all {held} tenants hold: each counter between the confirmed "
          f"consumption and that plus the abandoned ({len(reports)} reports)")


if __name__ == "__main__":
    main()
