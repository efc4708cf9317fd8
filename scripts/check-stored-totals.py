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
import sys

from prom_text import samples

COUNTERS = ["read_batches", "read_requests", "read_bytes", "write_batches",
            "write_requests", "write_bytes", "egress_bytes"]


def stored(path):
    """{tenant: {field: value}} of the request-unit buckets in a scrape."""
    tenants = {}
    for (name, labels), value in samples(path).items():
        labels = dict(labels)
        if not (name.startswith("tollgate_tenant_") and name.endswith("_total")):
            continue
        if labels.get("bucket", "") != "" or "tenant_id" not in labels:
            continue
        field = name[len("tollgate_tenant_"):-len("_total")]
        tenants.setdefault(labels["tenant_id"], {})[field] = value
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
