"""The table of a with/without benchmark (scripts/benchmark-budgets.sh,
scripts/benchmark-quotas.sh): per store, each round's rate of the two
kinds of run, the ratio of their medians (the cost of the second kind) and
the largest spread between rounds of one kind.

    python3 scripts/bench-summary.py OUT ROUNDS "STORES" PLAIN WITH "WHAT" UNIT

reads OUT/<store>-<kind>-r<round>.json as `tollgate bench --json` wrote it
(requests_per_second for token-bucket runs, checks_per_second for checks).
"""
import json
import statistics
import sys

out, rounds, stores, plain, with_, what, unit = sys.argv[1:8]
rounds, stores = int(rounds), stores.split()


def run(name):
    r = json.load(open(f"{out}/{name}.json"))
    rate = r.get("checks_per_second", r.get("requests_per_second"))
    errors = r["errors"] if "errors" in r else r["total"]["errors"]
    return rate, sum(errors.values()) if isinstance(errors, dict) else errors


print(f"\n{rounds} rounds of each, alternating\n")
print(f"| store | without {what}, {unit} | with {what}, {unit} | cost with / without (medians) | spread between rounds |")
print("|---|---|---|---:|---:|")
for store in stores:
    runs = {k: [run(f"{store}-{k}-r{i}") for i in range(1, rounds + 1)] for k in (plain, with_)}
    med = {k: statistics.median(v for v, _ in runs[k]) for k in runs}
    spread = max((max(v for v, _ in runs[k]) - min(v for v, _ in runs[k])) / med[k] for k in runs)
    errors = sum(e for k in runs for _, e in runs[k])
    fmt = lambda k: ", ".join(f"{v:,.0f}" for v, _ in runs[k])
    note = f" ({errors} errors)" if errors else ""
    print(f"| {store} | {fmt(plain)} | {fmt(with_)} | {med[plain] / med[with_]:.3f}{note} | {spread * 100:.1f} % |")
