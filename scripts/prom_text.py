"""Reads a Prometheus text-format scrape (what /metrics serves), for the
benchmark scripts' reports."""
import re

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(path):
    """{(name, frozenset of (label, value)): value} of every sample."""
    found = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            match = SAMPLE.match(line)
            if not match or line.startswith("#"):
                continue
            name, labels, value = match.groups()
            found[(name, frozenset(LABEL.findall(labels or "")))] = float(value)
    return found
