#!/usr/bin/env python3
"""Summarises scripts/benchmark-postgres-latency.sh: per open-loop run, the
latency the pods saw, the RPC's own time in the server, the store's stages
and the CPU each process spent per request; all from the run's files.

Usage: postgres-latency-report.py OUT RUNS
"""
import json
import os
import sys

from prom_text import samples as parse

STAGES = ["queued", "begin", "read", "write", "commit"]


def delta(before, after, name, **labels):
    want = set(labels.items())
    total = 0.0
    for (n, ls), value in after.items():
        if n == name and want <= set(ls):
            total += value - before.get((n, ls), 0.0)
    return total


def histogram(before, after, name, **labels):
    """count, mean seconds and the (le, cumulative count) pairs of a
    histogram's change between the two scrapes."""
    count = delta(before, after, name + "_count", **labels)
    total = delta(before, after, name + "_sum", **labels)
    bounds = sorted({dict(ls)["le"] for (n, ls) in after
                     if n == name + "_bucket" and set(labels.items()) <= set(ls)}, key=float)
    cumulative = [(float(le), delta(before, after, name + "_bucket", le=le, **labels)) for le in bounds]
    return count, (total / count if count else 0.0), cumulative


def quantile(q, count, cumulative):
    """Prometheus's histogram_quantile: linear within the bucket."""
    if not count:
        return 0.0
    rank = q * count
    lower, below = 0.0, 0.0
    for le, seen in cumulative:
        if seen >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(seen - below, 1e-9)
        lower, below = le, seen
    return lower


def ms(seconds):
    return f"{seconds * 1000:.2f}"


def main():
    out, runs, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:] or ["after"]
    hz = os.sysconf("SC_CLK_TCK")
    print("\n| build | run | requests/s | p50 ms | p99 ms | max ms | server p50 / p99 ms | requests per transaction "
          "| CPU µs per request: server / PostgreSQL / load generator | machine busy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    stage_rows = []
    for name in names:
        peak = json.load(open(os.path.join(out, f"{name}-max.json")))
        print(f"| {name} | max (closed loop) | {peak['requests_per_second']:.0f} | {peak['latency_us']['p50'] / 1000:.2f} "
              f"| {peak['latency_us']['p99'] / 1000:.2f} | {peak['latency_us']['max'] / 1000:.2f} | | | | |")
        stages = {stage: [0.0, 0.0, {}] for stage in STAGES}  # count, sum, cumulative by le
        for run in range(1, runs + 1):
            label = f"{name}-half-{run}"
            report = json.load(open(os.path.join(out, label + ".json")))
            before = parse(os.path.join(out, label + ".before.prom"))
            after = parse(os.path.join(out, label + ".after.prom"))
            rpc = histogram(before, after, "tollgate_rpc_duration_seconds", method="TokenBucket", code="OK")
            requests = rpc[0]
            transactions = delta(before, after, "tollgate_store_transactions_total")
            cpu_before = [int(x) for x in open(os.path.join(out, label + ".before.cpu")).read().split()]
            cpu_after = [int(x) for x in open(os.path.join(out, label + ".after.cpu")).read().split()]
            server, postgres, busy, every = (b - a for a, b in zip(cpu_before, cpu_after))
            bench_cpu = sum(float(x) for x in open(os.path.join(out, label + ".bench-cpu")).read().split())
            per = lambda seconds: f"{seconds / requests * 1e6:.0f}" if requests else "-"
            lat = report["latency_us"]
            print(f"| {name} | half {run} | {report['requests_per_second']:.0f} | {lat['p50'] / 1000:.2f} "
                  f"| {lat['p99'] / 1000:.2f} | {lat['max'] / 1000:.2f} "
                  f"| {ms(quantile(0.5, rpc[0], rpc[2]))} / {ms(quantile(0.99, rpc[0], rpc[2]))} "
                  f"| {requests / transactions if transactions else 0:.1f} "
                  f"| {per(server / hz)} / {per(postgres / hz)} / {per(bench_cpu)} "
                  f"| {busy / every * 100 if every else 0:.0f} % |")
            for stage in STAGES:
                count, mean, cumulative = histogram(before, after, "tollgate_store_stage_seconds", stage=stage)
                totals = stages[stage]
                totals[0] += count
                totals[1] += mean * count
                for le, seen in cumulative:
                    totals[2][le] = totals[2].get(le, 0.0) + seen
        for stage in STAGES:
            count, total, by_le = stages[stage]
            cumulative = sorted(by_le.items())
            stage_rows.append((name, stage, count, total / count if count else 0.0,
                               quantile(0.5, count, cumulative), quantile(0.99, count, cumulative)))
    print("\nStore stages over the half-load runs (tollgate_store_stage_seconds; p50/p99 interpolated in its buckets):\n")
    print("| build | stage | count | mean ms | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for name, stage, count, mean, p50, p99 in stage_rows:
        print(f"| {name} | {stage} | {count:.0f} | {ms(mean)} | {ms(p50)} | {ms(p99)} |")
    for name in ("perf-by-process.txt", "perf-server-symbols.txt"):
        path = os.path.join(out, name)
        if os.path.exists(path):
            print(f"\n{name} (the last half-load run of this build):\n" + open(path).read())


if __name__ == "__main__":
    main()
