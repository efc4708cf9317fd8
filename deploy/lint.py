#!/usr/bin/env python3
"""Checks of deploy/ that need no tool beyond Python 3.11 and PyYAML.

deploy/validate.sh runs each subcommand as one check; each prints what it
found wrong and exits 1, or prints a short summary and exits 0.

  yaml FILE...          well-formed YAML, no duplicate keys
  dashboard             deploy/grafana/tollgate.json: structure, layout, variables
  dashboard-rules OUT   the dashboard's queries as a rules file, for promtool
  metrics               tollgate_* names, labels and aggregations in the rules,
                        their tests, the dashboard and deploy/README.md, against
                        deploy/metric-names.txt
  kubernetes            deploy/kubernetes/* and deploy/prometheus/prometheus.yml
                        agree with each other, the Dockerfile and
                        deploy/serve-options.txt
  compose               deploy/compose/* agree with each other
  compose-healthcheck   the replicas' health check against a local /readyz
  docker                deploy/Dockerfile and .dockerignore
  envoy                 deploy/envoy/envoy.yaml against deploy/envoy/tiers.toml,
                        the Kubernetes Service and docs/envoy.md
  agent                 deploy/kubernetes/agent/* against each other,
                        deploy/agent-options.txt, the server's Service and
                        configuration, the Dockerfile and docs/any-language.md
  agent-probes          the agent's exec probes against a local /healthz and
                        /readyz
  k8s-sd-stub IN OUT    prometheus.yml with kubernetes_sd_configs swapped for
                        empty static_configs (for a promtool built without
                        Kubernetes discovery)
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
import tomllib
from pathlib import Path

try:
    import yaml
except ImportError:  # validate.sh only runs us with a Python that has it
    sys.exit("lint.py needs PyYAML")

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent

# Labels Prometheus attaches to every scraped series (job, instance) and the
# ones the Kubernetes scrape job adds.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "node"}


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")

    def finish(self, summary: str) -> int:
        if self.items:
            for item in self.items:
                print(item)
            return 1
        print(summary)
        return 0


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------
# YAML


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key] + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: Path) -> list:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d is not None]


def load_one(path: Path):
    docs = load_yaml(path)
    if len(docs) != 1:
        raise ValueError(f"{rel(path)}: expected one YAML document, found {len(docs)}")
    return docs[0]


def cmd_yaml(files: list[str]) -> int:
    p = Problems()
    for name in files:
        try:
            docs = load_yaml(Path(name))
            if not docs:
                p.add(name, "no YAML document")
        except (yaml.YAMLError, OSError) as e:
            p.add(name, str(e).replace("\n", " "))
    return p.finish(f"{len(files)} files parse, no duplicate keys")


# --------------------------------------------------------------------------
# Metric names and PromQL


class Metric:
    def __init__(self, name, kind, labels, aggregate):
        self.name, self.kind, self.aggregate = name, kind, aggregate
        self.labels = set() if labels == "-" else set(labels.split(","))


def load_metrics() -> dict[str, Metric]:
    metrics = {}
    for line in (DEPLOY / "metric-names.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, kind, labels, aggregate = line.split()
        assert kind in ("counter", "gauge", "histogram"), line
        assert aggregate in ("max", "sum"), line
        metrics[name] = Metric(name, kind, labels, aggregate)
    return metrics


def resolve_metric(metrics, name):
    """The family and the series suffix of an exported series name."""
    if name in metrics:
        return metrics[name], ""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in metrics and metrics[base].kind == "histogram":
            return metrics[base], suffix
    return None, None


AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
            "and", "or", "unless", "offset", "inf", "nan", "atan2"}
RATE_FUNCTIONS = {"rate", "irate", "increase"}
COUNTER_FUNCTIONS = RATE_FUNCTIONS | {"resets", "label_values"}

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<number>[0-9][0-9.eE+\-]*[a-z]*)
  | (?P<punct>=~|!~|!=|==|>=|<=|[(){}\[\],=<>+\-*/%^@])
""", re.VERBOSE)


def tokenize(expr: str):
    pos, out = 0, []
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def analyze(expr: str):
    """Selectors and aggregations of a PromQL expression.

    Returns (selectors, aggregations): each selector is (metric name, label
    names of its matchers, enclosing frames innermost first), a frame being
    ("agg", op) | ("func", name) | ("group", None); each aggregation is
    (op, by-labels or None, without-labels or None, metric names inside).
    """
    toks = tokenize(expr)
    selectors, aggregations = [], []
    stack = []  # frames: dict(kind, name, metrics, by, without)
    pending_agg = None  # an aggregation operator waiting for its "("
    last_closed_agg = None
    i = 0

    def read_label_list(j):
        assert toks[j][1] == "(", expr
        labels, j = [], j + 1
        while toks[j][1] != ")":
            if toks[j][0] == "ident":
                labels.append(toks[j][1])
            j += 1
        return labels, j + 1

    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "ident" and text in ("by", "without") and nxt == "(":
            labels, i = read_label_list(i + 1)
            target = pending_agg if pending_agg is not None else last_closed_agg
            if target is not None:
                target[text] = labels
            continue
        if kind == "ident" and text in ("on", "ignoring", "group_left", "group_right") and nxt == "(":
            _, i = read_label_list(i + 1)
            continue
        last_closed_agg = None
        if kind == "ident" and text in AGGREGATIONS and nxt in ("(", "by", "without"):
            pending_agg = {"kind": "agg", "name": text, "metrics": [], "by": None, "without": None}
            i += 1
            continue
        if text == "(":
            if pending_agg is not None:
                frame, pending_agg = pending_agg, None
            elif i > 0 and toks[i - 1][0] == "ident" and toks[i - 1][1] not in KEYWORDS:
                frame = {"kind": "func", "name": toks[i - 1][1], "metrics": []}
            else:
                frame = {"kind": "group", "name": None, "metrics": []}
            stack.append(frame)
            i += 1
            continue
        if text == ")":
            frame = stack.pop()
            if stack:
                stack[-1]["metrics"].extend(frame["metrics"])
            if frame["kind"] == "agg":
                aggregations.append(frame)
                last_closed_agg = frame
            i += 1
            continue
        if kind == "ident" and text not in KEYWORDS and nxt != "(":
            labels = []
            j = i + 1
            if nxt == "{":
                j += 1
                while toks[j][1] != "}":
                    if toks[j][0] == "ident" and toks[j + 1][1] in ("=", "!=", "=~", "!~"):
                        labels.append(toks[j][1])
                    j += 1
                j += 1
            # Inside a function that takes label names (label_values,
            # label_replace, ...), bare words after the first are labels.
            prev = toks[i - 1][1] if i > 0 else None
            if prev == "," and stack and stack[-1]["kind"] == "func":
                i = j
                continue
            frames = [(f["kind"], f["name"]) for f in reversed(stack)]
            selectors.append((text, labels, frames))
            if stack:
                stack[-1]["metrics"].append(text)
            i = j
            continue
        i += 1
    if stack:
        raise ValueError("unbalanced parentheses")
    return selectors, [(a["name"], a["by"], a["without"], a["metrics"]) for a in aggregations]


def check_expr(p: Problems, where: str, expr: str, metrics, records: set[str]) -> set[str]:
    """Checks one PromQL expression; returns the tollgate_* families it uses."""
    used = set()
    try:
        selectors, aggregations = analyze(expr)
    except (ValueError, IndexError, AssertionError) as e:
        p.add(where, f"cannot analyze {expr!r}: {e}")
        return used
    for name, labels, frames in selectors:
        if ":" in name:
            if name not in records:
                p.add(where, f"{name}: no recording rule defines it")
            continue
        if not name.startswith("tollgate_"):
            continue
        family, suffix = resolve_metric(metrics, name)
        if family is None:
            p.add(where, f"{name}: not in deploy/metric-names.txt")
            continue
        used.add(family.name)
        if family.kind == "histogram" and suffix == "":
            p.add(where, f"{name}: a histogram; use {name}_bucket, _sum or _count")
        allowed = family.labels | TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
        for label in labels:
            if label not in allowed:
                p.add(where, f"{name}: has no label {label!r} (labels: {', '.join(sorted(family.labels)) or 'none'})")
        funcs = [n for k, n in frames if k == "func"]
        aggs = [n for k, n in frames if k == "agg"]
        cumulative = family.kind == "counter" or family.kind == "histogram"
        if cumulative and (not funcs or funcs[0] not in COUNTER_FUNCTIONS):
            p.add(where, f"{name}: a cumulative counter, used outside rate/irate/increase")
        if family.kind == "gauge" and funcs and funcs[0] in RATE_FUNCTIONS:
            p.add(where, f"{name}: a gauge inside {funcs[0]}()")
        if family.aggregate == "max" and aggs and aggs[0] in ("sum", "count"):
            p.add(where, f"{name}: every replica exports the same value; aggregate with max by (tenant_id, bucket), not {aggs[0]}")
        if family.aggregate == "sum" and aggs and aggs[0] in ("max", "min", "avg") and name != "tollgate_build_info":
            p.add(where, f"{name}: a per-replica counter; aggregate replicas with sum, not {aggs[0]}")
    for op, by, without, inside in aggregations:
        families = [resolve_metric(metrics, n) for n in inside]
        if not inside or any(f is None for f, _ in families):
            continue  # recording rules or other metrics inside: labels unknown here
        available = set(TARGET_LABELS)
        for f, suffix in families:
            available |= f.labels | ({"le"} if suffix == "_bucket" else set())
        for label in (by or []) + (without or []):
            if label not in available:
                p.add(where, f"{op} by/without ({label}): no series inside has that label")
    return used


def check_buckets_apart(p: Problems, where: str, expr: str, metrics) -> None:
    """A rule never adds up a tenant's buckets: they count different things
    (request units, an action's own unit) and have their own limits. Every
    aggregation over series with a bucket label keeps it (by (..., bucket))."""
    try:
        _, aggregations = analyze(expr)
    except (ValueError, IndexError, AssertionError):
        return  # check_expr said so
    for op, by, without, inside in aggregations:
        families = [resolve_metric(metrics, n)[0] for n in inside]
        if not any(f is not None and "bucket" in f.labels for f in families):
            continue
        if by is None and without is None or "bucket" not in (by or ["bucket"]) or "bucket" in (without or []):
            p.add(where, f"{op}: aggregates buckets together; keep them apart with by (tenant_id, bucket)")


def rules_exprs(path: Path):
    doc = load_one(path)
    records, exprs = set(), []
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            if "record" in rule:
                records.add(rule["record"])
            exprs.append((f"{rel(path)}: {group['name']}: {name}", rule["expr"]))
    return records, exprs


DASHBOARD = DEPLOY / "grafana" / "tollgate.json"
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h",
                    "__interval_ms": "60000", "__range_s": "3600"}


def dashboard_queries(dash):
    """(where, expr) for every panel target; Grafana variables substituted."""
    out = []

    def substitute(expr):
        def repl(m):
            name = m.group(1) or m.group(2)
            if name in GRAFANA_BUILTINS:
                return GRAFANA_BUILTINS[name]
            return ".*"
        return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels", []))
            for t in panel.get("targets", []):
                out.append((f"{rel(DASHBOARD)}: panel {panel.get('title')!r} {t.get('refId')}",
                            t.get("expr", ""), substitute(t.get("expr", ""))))
    walk(dash.get("panels", []))
    return out


def cmd_metrics() -> int:
    p = Problems()
    metrics = load_metrics()
    used: set[str] = set()
    records, exprs = rules_exprs(DEPLOY / "prometheus" / "rules.yml")
    for where, expr in exprs:
        used |= check_expr(p, where, expr, metrics, records)
        check_buckets_apart(p, where, expr, metrics)
    n = len(exprs)

    dash = json.loads(DASHBOARD.read_text())
    for where, _raw, expr in dashboard_queries(dash):
        used |= check_expr(p, where, expr, metrics, records)
        n += 1
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and q:
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            if not m:
                p.add(rel(DASHBOARD), f"variable {var['name']}: expected label_values(SELECTOR, LABEL), got {q!r}")
                continue
            used |= check_expr(p, f"{rel(DASHBOARD)}: variable {var['name']}", m.group(1), metrics, records)
            family, _ = resolve_metric(metrics, m.group(1).split("{")[0].strip())
            if family and m.group(2) not in family.labels:
                p.add(rel(DASHBOARD), f"variable {var['name']}: {family.name} has no label {m.group(2)!r}")
            n += 1

    # The unit tests' input series: a typo there would test nothing.
    tests = load_one(DEPLOY / "prometheus" / "rules.test.yml")
    for group in tests["tests"]:
        for series in group.get("input_series", []):
            sel = series["series"]
            used |= check_expr(p, f"{rel(DEPLOY / 'prometheus' / 'rules.test.yml')}: {group['name']}",
                               f"rate({sel}[1m])" if re.match(r"tollgate_\w+_(total|bucket)\{", sel) else sel,
                               metrics, records)
            n += 1

    # Names quoted in the deploy docs.
    readme = DEPLOY / "README.md"
    for name in set(re.findall(r"(?<![\w:])tollgate_[a-z0-9_]+\*?(?![\w:])", readme.read_text())):
        if name.endswith("*"):  # a prefix, as in tollgate_store_*
            if not any(m.startswith(name[:-1]) for m in metrics):
                p.add(rel(readme), f"{name}: no metric in deploy/metric-names.txt starts so")
            continue
        family, _ = resolve_metric(metrics, name)
        if family is None:
            p.add(rel(readme), f"{name}: not in deploy/metric-names.txt")
        else:
            used.add(family.name)

    # Every tenant metric should be visible somewhere.
    for name in sorted(set(metrics) - used):
        if name.startswith("tollgate_tenant_"):
            p.add("deploy/", f"{name}: listed but used by no rule or dashboard panel")
    return p.finish(f"{n} expressions and series use {len(used)} of the {len(metrics)} listed metrics correctly")


# --------------------------------------------------------------------------
# Grafana dashboard


BUCKET_QUERY = 'label_values(tollgate_tenant_tokens{tenant_id=~"$tenant"}, bucket)'
# Series per tenant and bucket, which every panel query narrows to the
# selected tenants and buckets.
PER_BUCKET = re.compile(r"\btollgate_(tenant_\w+|token_bucket_grants_total)\b")
BUCKET_FILTERS = ('tenant_id=~"$tenant"', 'bucket=~"$bucket"')


def cmd_dashboard() -> int:
    p = Problems()
    where = rel(DASHBOARD)
    try:
        dash = json.loads(DASHBOARD.read_text())
    except json.JSONDecodeError as e:
        print(f"{where}: {e}")
        return 1
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in dash:
            p.add(where, f"no {key!r}")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        p.add(where, "expected a variable 'datasource' of type datasource, query prometheus")
    tenant = variables.get("tenant")
    q = tenant and tenant.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    if not tenant or q != "label_values(tollgate_tenant_tokens, tenant_id)":
        p.add(where, "expected a variable 'tenant' with query label_values(tollgate_tenant_tokens, tenant_id)")
    bucket = variables.get("bucket")
    q = bucket and bucket.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    if not bucket or q != BUCKET_QUERY:
        p.add(where, f"expected a variable 'bucket' with query {BUCKET_QUERY}")
    elif not (bucket.get("multi") and bucket.get("includeAll") and bucket.get("allValue") == ".*"):
        # Prometheus keeps no label for the request-unit bucket's empty name,
        # so label_values never lists it: only an All of .* matches it.
        p.add(where, "variable bucket: expected multi, includeAll and allValue .* (All must match bucket=\"\")")
    for var in variables.values():
        if var.get("type") == "query" and not (isinstance(var.get("datasource"), dict)
                                               and var["datasource"].get("uid") == "${datasource}"):
            p.add(where, f"variable {var['name']}: datasource is not the ${{datasource}} variable")
    if "__inputs" in dash:
        p.add(where, "__inputs: provisioning cannot fill them in; use the datasource variable")

    ids, rects, n = set(), [], 0

    def ds_ok(ref):
        return isinstance(ref, dict) and ref.get("type") == "prometheus" and ref.get("uid") == "${datasource}"

    for panel in dash.get("panels", []):
        n += 1
        title = panel.get("title", "?")
        pid = panel.get("id")
        if pid in ids:
            p.add(where, f"panel {title!r}: id {pid} used twice")
        ids.add(pid)
        g = panel.get("gridPos", {})
        if not all(k in g for k in ("x", "y", "w", "h")) or g["x"] < 0 or g["x"] + g["w"] > 24:
            p.add(where, f"panel {title!r}: gridPos {g} outside the 24 columns")
            continue
        for other_title, o in rects:
            if g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]:
                p.add(where, f"panel {title!r} overlaps panel {other_title!r}")
        rects.append((title, g))
        if panel.get("type") == "row":
            continue
        if not ds_ok(panel.get("datasource")):
            p.add(where, f"panel {title!r}: datasource is not the ${{datasource}} variable")
        targets = panel.get("targets") or []
        if not targets:
            p.add(where, f"panel {title!r}: no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            p.add(where, f"panel {title!r}: refIds {refs} not unique")
        for t in targets:
            if not t.get("expr", "").strip():
                p.add(where, f"panel {title!r} {t.get('refId')}: empty query")
            if "datasource" in t and not ds_ok(t["datasource"]):
                p.add(where, f"panel {title!r} {t.get('refId')}: datasource is not the ${{datasource}} variable")
            if PER_BUCKET.search(t.get("expr", "")) and not all(f in t["expr"] for f in BUCKET_FILTERS):
                p.add(where, f"panel {title!r} {t.get('refId')}: a per-bucket metric not filtered by "
                             + " and ".join(BUCKET_FILTERS))
            for m in re.finditer(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", t.get("expr", "")):
                name = m.group(1) or m.group(2)
                if name not in variables and name not in GRAFANA_BUILTINS:
                    p.add(where, f"panel {title!r} {t.get('refId')}: unknown variable ${name}")
    return p.finish(f"{n} panels, ids unique, layout without overlaps, variables datasource, tenant and bucket")


def cmd_dashboard_rules(out: str) -> int:
    """The dashboard's queries as recording rules, for promtool check rules."""
    dash = json.loads(DASHBOARD.read_text())
    rules = [{"record": f"dashboard_query_{i}", "expr": expr}
             for i, (_w, _raw, expr) in enumerate(dashboard_queries(dash))]
    Path(out).write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    print(f"{len(rules)} queries")
    return 0


# --------------------------------------------------------------------------
# Server options


def load_options():
    options = {}
    for line in (DEPLOY / "serve-options.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, kind, values = line.split()
            options[name] = (kind, None if values == "-" else values.split("|"))
    return options


def env_option(options, var):
    """The option an environment variable sets, or None."""
    if var == "TOLLGATE_CONFIG":
        return "config"
    if not var.startswith("TOLLGATE_"):
        return None
    name = var[len("TOLLGATE_"):].lower().replace("_", "-")
    return name if name in options else False


DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h|d))+$")


def check_option_value(p, where, options, name, value):
    if name not in options:
        p.add(where, f"{name}: not an option of tollgate serve (deploy/serve-options.txt)")
        return
    kind, allowed = options[name]
    ok = {
        "string": isinstance(value, str),
        "strings": isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
        "bool": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "duration": isinstance(value, str) and bool(DURATION.match(value)),
    }[kind]
    if not ok:
        p.add(where, f"{name} = {value!r}: expected a {kind}")
    elif allowed and value not in allowed:
        p.add(where, f"{name} = {value!r}: expected one of {', '.join(allowed)}")


def port_of(address: str) -> int:
    return int(str(address).rsplit(":", 1)[1])


def check_env(p, where, options, env: dict):
    for var, value in env.items():
        name = env_option(options, var)
        if name is False:
            p.add(where, f"{var}: no option {var[9:].lower().replace('_', '-')} in deploy/serve-options.txt")
        elif name and name != "config":
            kind, _ = options[name]
            if kind in ("integer", "number"):
                try:
                    value = float(value) if kind == "number" else int(value)
                except ValueError:
                    pass
            elif kind == "bool":
                value = {"true": True, "false": False}.get(str(value), value)
            check_option_value(p, where, options, name, value)


# --------------------------------------------------------------------------
# Dockerfile


def dockerfile():
    """(instructions as (keyword, arguments), stage names) of deploy/Dockerfile."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def dockerignore_patterns():
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append(line)
    return patterns


def ignored(path: str, patterns) -> bool:
    """Whether .dockerignore leaves path (relative to the root) out: the last
    matching pattern wins, and a pattern matching a parent excludes it too."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        pats = {pat, pat.replace("**/", "")} if pat.startswith("**/") else {pat}
        if any(fnmatch.fnmatchcase(c, q) for c in candidates for q in pats):
            result = not negate
    return result


def cmd_docker() -> int:
    p = Problems()
    where = "deploy/Dockerfile"
    options = load_options()
    instructions = dockerfile()
    patterns = dockerignore_patterns()
    stages = [args for kw, args in instructions if kw == "FROM"]
    if len(stages) < 2:
        p.add(where, "expected a multi-stage build")
    copied = set()
    for kw, args in instructions:
        if kw == "COPY" and "--from" not in args:
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for src in sources:
                copied.add(src.strip("/").rstrip("/"))
                if not (ROOT / src).exists():
                    p.add(where, f"COPY {src}: no such path in the repository")
                elif ignored(src, patterns):
                    p.add(".dockerignore", f"leaves out {src}, which the Dockerfile copies")
    # cargo loads every workspace member.
    cargo = (ROOT / "Cargo.toml").read_text()
    members = re.search(r"members\s*=\s*\[(.*?)\]", cargo, re.S)
    for member in re.findall(r'"([^"]+)"', members.group(1) if members else ""):
        if not any(member == c or member.startswith(c + "/") for c in copied):
            p.add(where, f"workspace member {member} is not copied into the build stage")
    for needed in ("Cargo.toml", "Cargo.lock", "proto", "sql"):
        if needed not in copied:
            p.add(where, f"{needed} is not copied into the build stage")
    for path in ("target", ".git", "tollgate.redb"):
        if not ignored(path, patterns):
            p.add(".dockerignore", f"does not leave out {path}")
    final = instructions[max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM"):]
    users = [a for kw, a in final if kw == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
        p.add(where, "the final stage must end with a numeric, non-root USER")
    expose = " ".join(a for kw, a in final if kw == "EXPOSE").split()
    for port in ("50051", "9464"):
        if port not in expose:
            p.add(where, f"EXPOSE lacks {port}")
    if ("ENTRYPOINT", '["tollgate"]') not in final:
        p.add(where, 'expected ENTRYPOINT ["tollgate"]')
    if ("CMD", '["serve"]') not in final:
        p.add(where, 'expected CMD ["serve"]')
    builds = [a for kw, a in instructions if kw == "RUN" and "cargo build" in a]
    if not builds or "--locked" not in builds[0] or "-p tollgate" not in builds[0]:
        p.add(where, "expected cargo build --release --locked -p tollgate")
    env = {}
    for kw, args in final:
        if kw == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    check_env(p, where, options, env)
    return p.finish(f"{len(stages)} stages; COPY sources exist and pass .dockerignore; "
                    f"non-root USER {users[-1] if users else '?'}")


def docker_user():
    for kw, args in reversed(dockerfile()):
        if kw == "USER":
            uid, _, gid = args.partition(":")
            return int(uid), int(gid or uid)
    return None, None


# --------------------------------------------------------------------------
# Kubernetes


K8S = DEPLOY / "kubernetes"

POD_SD_KEYS = {"role", "namespaces", "selectors", "api_server", "kubeconfig_file", "attach_metadata",
               "basic_auth", "authorization", "oauth2", "tls_config", "proxy_url", "follow_redirects",
               "enable_http2", "no_proxy", "proxy_from_environment", "proxy_connect_header"}
POD_META = {"__meta_kubernetes_namespace", "__meta_kubernetes_pod_name", "__meta_kubernetes_pod_ip",
            "__meta_kubernetes_pod_container_init", "__meta_kubernetes_pod_container_name",
            "__meta_kubernetes_pod_container_id", "__meta_kubernetes_pod_container_image",
            "__meta_kubernetes_pod_container_port_name", "__meta_kubernetes_pod_container_port_number",
            "__meta_kubernetes_pod_container_port_protocol", "__meta_kubernetes_pod_ready",
            "__meta_kubernetes_pod_phase", "__meta_kubernetes_pod_node_name",
            "__meta_kubernetes_pod_host_ip", "__meta_kubernetes_pod_uid",
            "__meta_kubernetes_pod_controller_kind", "__meta_kubernetes_pod_controller_name"}


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def subset(a: dict, b: dict) -> bool:
    return all(b.get(k) == v for k, v in (a or {}).items())


def container_ports(container):
    return {p.get("name"): p["containerPort"] for p in container.get("ports", [])}


def probe_port(probe):
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            return probe[kind]["port"]
    return None


def cmd_kubernetes() -> int:
    import tomllib

    p = Problems()
    options = load_options()
    kustomization = load_one(K8S / "kustomization.yaml")
    resources = kustomization.get("resources", [])
    docs = {}
    for name in resources:
        path = K8S / name
        if not path.exists():
            p.add("kustomization.yaml", f"resource {name}: no such file")
            continue
        for doc in load_yaml(path):
            docs[(doc["kind"], doc["metadata"]["name"])] = (name, doc)
    # The *.example.yaml files are Secrets with placeholders, never applied.
    examples = sorted(f.name for f in K8S.glob("*.example.yaml"))
    for name in examples:
        if name in resources:
            p.add("kustomization.yaml", f"lists {name}: applying it would overwrite the real Secret")
    for f in sorted(K8S.glob("*.yaml")):
        if f.name not in resources and f.name != "kustomization.yaml" and f.name not in examples:
            p.add("kustomization.yaml", f"does not list {f.name}")
    example_secrets = {}
    for name in examples:
        doc = load_one(K8S / name)
        if doc.get("kind") != "Secret":
            p.add(name, "an example file that is not a Secret")
            continue
        example_secrets[doc["metadata"]["name"]] = set(doc.get("stringData", {}))

    def get(kind, name=None):
        found = [d for (k, n), (_, d) in docs.items() if k == kind and (name is None or n == name)]
        return found[0] if found else None

    deploy = get("Deployment")
    if deploy is None:
        p.add("deploy/kubernetes", "no Deployment")
        return p.finish("")
    where = "deployment.yaml"
    spec = deploy["spec"]
    pod = spec["template"]
    pod_labels = pod["metadata"].get("labels", {})
    annotations = pod["metadata"].get("annotations", {})
    podspec = pod["spec"]
    if not subset(spec["selector"].get("matchLabels"), pod_labels):
        p.add(where, "selector does not match the pod template's labels")
    if spec.get("replicas", 1) < 2:
        p.add(where, "fewer than 2 replicas")

    containers = {c["name"]: c for c in podspec["containers"]}
    inits = {c["name"]: c for c in podspec.get("initContainers", [])}
    server = containers.get("tollgate")
    if server is None:
        p.add(where, "no container named tollgate")
        return p.finish("")
    ports = container_ports(server)

    # Security: every container runs as the image's non-root user, read-only.
    uid, gid = docker_user()
    psc = podspec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        p.add(where, "pod securityContext.runAsNonRoot is not true")
    if psc.get("runAsUser") != uid or psc.get("runAsGroup") != gid:
        p.add(where, f"pod runAsUser/runAsGroup differ from the Dockerfile's USER {uid}:{gid}")
    for c in list(containers.values()) + list(inits.values()):
        sc = c.get("securityContext", {})
        if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False:
            p.add(where, f"container {c['name']}: needs readOnlyRootFilesystem true, allowPrivilegeEscalation false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            p.add(where, f"container {c['name']}: does not drop ALL capabilities")
        if "resources" not in c or "requests" not in c["resources"]:
            p.add(where, f"container {c['name']}: no resource requests")
    if not any(c.get("args", [None])[0] == "migrate" for c in inits.values()):
        p.add(where, "no init container running tollgate migrate")

    # Probes point at declared ports.
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = server.get(kind)
        if probe is None:
            if kind != "startupProbe":
                p.add(where, f"no {kind}")
            continue
        port = probe_port(probe)
        if port not in ports and port not in ports.values():
            p.add(where, f"{kind}: port {port} is not a container port")
        if "httpGet" in probe and probe["httpGet"]["path"] not in ("/healthz", "/readyz"):
            p.add(where, f"{kind}: the server answers /healthz and /readyz, not {probe['httpGet']['path']}")
    live = server.get("livenessProbe", {})
    if live.get("httpGet", {}).get("path") == "/readyz" or "grpc" in live:
        p.add(where, "livenessProbe depends on the store: a database outage would restart every replica")

    # Scrape annotations.
    if annotations.get("prometheus.io/scrape") != "true":
        p.add(where, "pod annotation prometheus.io/scrape is not \"true\"")
    if annotations.get("prometheus.io/path") != "/metrics":
        p.add(where, "pod annotation prometheus.io/path is not /metrics")
    if str(annotations.get("prometheus.io/port")) != str(ports.get("metrics")):
        p.add(where, "pod annotation prometheus.io/port differs from the container port named metrics")

    # The config file: mounted where --config says, with known options.
    args = server.get("args", [])
    config_path = args[args.index("--config") + 1] if "--config" in args else None
    if config_path is None:
        p.add(where, "the server is not given --config")
    cm_name = cm_key = None
    for mount in server.get("volumeMounts", []):
        if config_path and config_path.startswith(mount["mountPath"].rstrip("/") + "/"):
            volume = next((v for v in podspec.get("volumes", []) if v["name"] == mount["name"]), None)
            if volume and "configMap" in volume:
                cm_name = volume["configMap"]["name"]
                cm_key = config_path[len(mount["mountPath"].rstrip("/")) + 1:]
    cm = get("ConfigMap", cm_name) if cm_name else None
    if cm is None or cm_key not in cm.get("data", {}):
        p.add(where, f"--config {config_path}: no ConfigMap key mounted there")
    else:
        try:
            config = tomllib.loads(cm["data"][cm_key])
        except tomllib.TOMLDecodeError as e:
            p.add("configmap.yaml", f"{cm_key}: {e}")
            config = {}
        for key, value in config.items():
            check_option_value(p, f"configmap.yaml: {cm_key}", options, key, value)
        if "listen" in config and port_of(config["listen"]) != ports.get("grpc"):
            p.add("configmap.yaml", "listen port differs from the container port named grpc")
        if "metrics-listen" in config and port_of(config["metrics-listen"]) != ports.get("metrics"):
            p.add("configmap.yaml", "metrics-listen port differs from the container port named metrics")
        for key in ("listen", "metrics-listen"):
            if not str(config.get(key, "")).startswith("0.0.0.0:"):
                p.add("configmap.yaml", f"{key} must be on 0.0.0.0 in a container")

        # Files the configuration names (credentials, certificates) lie in
        # a mounted Secret whose example has them.
        secret_mounts = {}
        for mount in server.get("volumeMounts", []):
            volume = next((v for v in podspec.get("volumes", []) if v["name"] == mount["name"]), None)
            if volume and "secret" in volume:
                secret_mounts[mount["mountPath"].rstrip("/")] = volume["secret"]["secretName"]
                if volume["secret"]["secretName"] not in example_secrets:
                    p.add(where, f"volume {volume['name']}: Secret {volume['secret']['secretName']} has no *.example.yaml")
        for key in ("tls-cert", "tls-key", "tls-client-ca", "admin-tokens-file", "pod-tokens-file", "pg-ca-file"):
            if key not in config:
                continue
            path = str(config[key])
            directory, _, file = path.rpartition("/")
            secret_name = secret_mounts.get(directory)
            if secret_name is None:
                p.add("configmap.yaml", f"{key} = {path!r}: not in a mounted Secret")
            elif file not in example_secrets.get(secret_name, set()):
                p.add("configmap.yaml", f"{key} = {path!r}: Secret {secret_name}'s example has no key {file}")

    # Environment: the Secrets of the *.example.yaml files, known options.
    for c in list(containers.values()) + list(inits.values()):
        env = {}
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in example_secrets.get(ref["name"], set()):
                p.add(where, f"container {c['name']}: {e['name']} refers to a Secret key no *.example.yaml has")
            env[e["name"]] = e.get("value", "")
        check_env(p, f"{where}: container {c['name']}", options, {k: v for k, v in env.items() if v})

    # Images are the ones kustomization.yaml rewrites.
    image_names = {i["name"] for i in kustomization.get("images", [])}
    for c in list(containers.values()) + list(inits.values()):
        if c["image"].split(":")[0] not in image_names:
            p.add(where, f"container {c['name']}: image {c['image']} is not in kustomization.yaml's images")

    # Service and PodDisruptionBudget select the pods, on declared ports.
    svc = get("Service")
    if svc is None:
        p.add("service.yaml", "no Service")
    else:
        if not subset(svc["spec"].get("selector"), pod_labels):
            p.add("service.yaml", "selector does not match the pods")
        for sp in svc["spec"]["ports"]:
            tp = sp.get("targetPort", sp["port"])
            if tp not in ports and tp not in ports.values():
                p.add("service.yaml", f"port {sp.get('name')}: targetPort {tp} is not a container port")
        if {sp["port"] for sp in svc["spec"]["ports"]} != {50051, 9464}:
            p.add("service.yaml", "expected ports 50051 and 9464")
    pdb = get("PodDisruptionBudget")
    if pdb is None:
        p.add("pdb.yaml", "no PodDisruptionBudget")
    elif not subset(pdb["spec"]["selector"].get("matchLabels"), pod_labels):
        p.add("pdb.yaml", "selector does not match the pods")
    elif pdb["spec"].get("minAvailable", 0) == spec.get("replicas", 1):
        p.add("pdb.yaml", "minAvailable equals the replicas: no node could ever be drained")

    # The Prometheus job finds these pods.
    namespace = kustomization.get("namespace")
    prom = load_one(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = [j for j in prom.get("scrape_configs", []) if j.get("job_name") == "tollgate"]
    if not jobs:
        p.add("prometheus.yml", "no scrape job named tollgate (the rules and the dashboard expect it)")
    for job in jobs:
        for sd in job.get("kubernetes_sd_configs", []):
            for key in sd:
                if key not in POD_SD_KEYS:
                    p.add("prometheus.yml", f"kubernetes_sd_configs: unknown key {key}")
            if sd.get("role") != "pod":
                p.add("prometheus.yml", "kubernetes_sd_configs: the relabeling expects role pod")
            names = sd.get("namespaces", {}).get("names")
            if names is not None and namespace not in names:
                p.add("prometheus.yml", f"kubernetes_sd_configs: namespace {namespace} is not discovered")
        meta = {f"__meta_kubernetes_pod_annotation_{sanitize(k)}": str(v) for k, v in annotations.items()}
        meta |= {f"__meta_kubernetes_pod_annotationpresent_{sanitize(k)}": "true" for k in annotations}
        meta |= {f"__meta_kubernetes_pod_label_{sanitize(k)}": str(v) for k, v in pod_labels.items()}
        meta |= {f"__meta_kubernetes_pod_labelpresent_{sanitize(k)}": "true" for k in pod_labels}
        meta["__meta_kubernetes_namespace"] = namespace
        meta["__meta_kubernetes_pod_phase"] = "Running"
        port_names = [n for n in ports if n]
        for rc in job.get("relabel_configs", []):
            for label in rc.get("source_labels", []):
                if label.startswith("__meta_kubernetes_") and label not in meta and label not in POD_META:
                    p.add("prometheus.yml", f"relabel source {label}: the pods have no such annotation or label")
            if rc.get("action") in ("keep", "drop") and len(rc.get("source_labels", [])) == 1:
                label = rc["source_labels"][0]
                regex = re.compile(str(rc.get("regex", "(.*)")))
                if label == "__meta_kubernetes_pod_container_port_name":
                    values = port_names
                elif label in meta:
                    values = [meta[label]]
                else:
                    continue
                matched = any(regex.fullmatch(v) for v in values)
                if matched != (rc["action"] == "keep"):
                    p.add("prometheus.yml", f"relabel {rc['action']} on {label} (regex {rc.get('regex')}) drops Tollgate's pods")
    return p.finish(f"{len(docs)} resources in kustomization.yaml agree with each other, "
                    "the Dockerfile, the Secret example and the Prometheus job")


def cmd_k8s_sd_stub(src: str, out: str) -> int:
    doc = load_one(Path(src))
    n = 0
    for job in doc.get("scrape_configs", []):
        if "kubernetes_sd_configs" in job:
            del job["kubernetes_sd_configs"]
            job.setdefault("static_configs", []).append({"targets": []})
            n += 1
    Path(out).write_text(yaml.safe_dump(doc, sort_keys=False))
    print(f"{n} kubernetes_sd_configs replaced")
    return 0


# --------------------------------------------------------------------------
# Compose


COMPOSE = DEPLOY / "compose"


def cmd_compose() -> int:
    p = Problems()
    where = "compose.yaml"
    options = load_options()
    doc = load_one(COMPOSE / "compose.yaml")
    services = doc.get("services", {})
    for name in ("postgres", "migrate", "tollgate-1", "tollgate-2", "prometheus", "grafana"):
        if name not in services:
            p.add(where, f"no service {name}")
    if p.items:
        return p.finish("")
    pg_env = services["postgres"].get("environment", {})

    for name, svc in services.items():
        build = svc.get("build")
        if build:
            context = (COMPOSE / build.get("context", ".")).resolve()
            if not (context / build.get("dockerfile", "Dockerfile")).exists():
                p.add(where, f"{name}: build dockerfile {build.get('dockerfile')} not found in {rel(context)}")
        for volume in svc.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")) and not (COMPOSE / source).exists():
                p.add(where, f"{name}: bind mount source {source} does not exist")
            if not source.startswith((".", "/")) and source not in (doc.get("volumes") or {}):
                p.add(where, f"{name}: volume {source} is not declared")
        for dep in svc.get("depends_on", {}):
            if dep not in services:
                p.add(where, f"{name}: depends on unknown service {dep}")

    servers = ["tollgate-1", "tollgate-2"]
    for name in servers + ["migrate"]:
        svc = services[name]
        env = {k: str(v) for k, v in svc.get("environment", {}).items()}
        check_env(p, f"{where}: {name}", options, env)
        url = env.get("TOLLGATE_STORE") or env.get("DATABASE_URL", "")
        m = re.fullmatch(r"postgres(?:ql)?://([^:@]+):([^@]*)@([^:/]+):(\d+)/(\w+)", url)
        if not m:
            p.add(where, f"{name}: store {url!r} is not a postgres://user:password@host:port/db URL")
        elif m.groups() != (pg_env.get("POSTGRES_USER"), pg_env.get("POSTGRES_PASSWORD"), "postgres", "5432",
                            pg_env.get("POSTGRES_DB")):
            p.add(where, f"{name}: store URL does not match the postgres service's user, password and database")
        deps = svc.get("depends_on", {})
        if deps.get("postgres", {}).get("condition") != "service_healthy":
            p.add(where, f"{name}: does not wait for postgres to be healthy")
    for name in servers:
        env = services[name].get("environment", {})
        if not str(env.get("TOLLGATE_LISTEN", "")).startswith("0.0.0.0:") or \
                not str(env.get("TOLLGATE_METRICS_LISTEN", "")).startswith("0.0.0.0:"):
            p.add(where, f"{name}: must listen on 0.0.0.0 (gRPC and metrics)")
        if services[name].get("depends_on", {}).get("migrate", {}).get("condition") != "service_completed_successfully":
            p.add(where, f"{name}: does not wait for migrate to complete")
        if env.get("TOLLGATE_LOG_FORMAT") != "json":
            p.add(where, f"{name}: logs are not json")
    if services["migrate"].get("command") != ["migrate"]:
        p.add(where, "migrate: command is not [\"migrate\"]")
    for port in services["postgres"].get("ports", []) + services["tollgate-1"].get("ports", []):
        if not str(port).startswith("127.0.0.1:"):
            p.add(where, f"port {port} is published beyond localhost")

    # Prometheus scrapes the servers' metrics ports under job tollgate.
    prom = load_one(COMPOSE / "prometheus.yml")
    jobs = {j["job_name"]: j for j in prom.get("scrape_configs", [])}
    targets = [t for sc in jobs.get("tollgate", {}).get("static_configs", []) for t in sc.get("targets", [])]
    expected = {f"{n}:{port_of(services[n]['environment']['TOLLGATE_METRICS_LISTEN'])}" for n in servers}
    if set(targets) != expected:
        p.add("prometheus.yml", f"job tollgate targets {targets}, expected {sorted(expected)}")
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["prometheus"].get("volumes", [])}
    for rule_file in prom.get("rule_files", []):
        target = rule_file if rule_file.startswith("/") else f"/etc/prometheus/{rule_file}"
        if target not in mounts:
            p.add("prometheus.yml", f"rule file {rule_file}: nothing is mounted at {target}")

    # Grafana: the datasource is the prometheus service, the dashboard is mounted
    # where the provider looks.
    datasources = load_one(COMPOSE / "grafana" / "datasources.yaml")["datasources"]
    if not any(d.get("url") == "http://prometheus:9090" and d.get("type") == "prometheus" for d in datasources):
        p.add("grafana/datasources.yaml", "no Prometheus datasource at http://prometheus:9090")
    providers = load_one(COMPOSE / "grafana" / "dashboards.yaml")["providers"]
    gmounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in services["grafana"].get("volumes", [])}
    dash_targets = [t for t, s in gmounts.items() if s.endswith("grafana/tollgate.json")]
    paths = [pr.get("options", {}).get("path", "") for pr in providers]
    if not dash_targets or not any(dash_targets[0].startswith(path.rstrip("/") + "/") for path in paths):
        p.add("grafana/dashboards.yaml", "no provider path holds the mounted deploy/grafana/tollgate.json")
    for target, source in gmounts.items():
        if source.startswith("./grafana/") and not target.startswith("/etc/grafana/provisioning/"):
            p.add(where, f"grafana: {source} is not mounted under /etc/grafana/provisioning/")
    return p.finish(f"{len(services)} services: build, mounts, store URL, options, scrape targets "
                    "and Grafana provisioning agree")


def cmd_compose_healthcheck() -> int:
    """Runs the replicas' health-check command against a local stand-in for
    the metrics port: healthy on 200 from /readyz, unhealthy on 503 or when
    nothing listens."""
    import http.server
    import subprocess
    import threading

    doc = load_one(COMPOSE / "compose.yaml")
    test = doc["services"]["tollgate-1"]["healthcheck"]["test"]
    if test[:1] != ["CMD"] or test[1:3] != ["bash", "-c"]:
        print(f"expected [CMD, bash, -c, SCRIPT], got {test}")
        return 1
    script = test[3]
    port = port_of(doc["services"]["tollgate-1"]["environment"]["TOLLGATE_METRICS_LISTEN"])
    if f"/dev/tcp/127.0.0.1/{port}" not in script or "/readyz" not in script:
        print(f"the health check does not ask 127.0.0.1:{port}/readyz")
        return 1
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = status["code"] if self.path == "/readyz" else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok\n" if code == 200 else b"not ready\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    local = script.replace(f"/dev/tcp/127.0.0.1/{port}", f"/dev/tcp/127.0.0.1/{server.server_port}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def run():
        return subprocess.run(["bash", "-c", local], capture_output=True, timeout=10).returncode

    p = Problems()
    try:
        if run() != 0:
            p.add("compose.yaml", "health check fails while /readyz answers 200")
        status["code"] = 503
        if run() == 0:
            p.add("compose.yaml", "health check passes while /readyz answers 503")
    finally:
        server.shutdown()
        server.server_close()
    if run() == 0:
        p.add("compose.yaml", "health check passes while nothing listens")
    return p.finish("healthy on 200, unhealthy on 503 and with nothing listening")


# --------------------------------------------------------------------------
# Envoy (docs/envoy.md)

ENVOY = DEPLOY / "envoy"
RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
TENANT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def walk(node):
    """Every mapping in a YAML tree."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def envoy_bucket(actions: list) -> tuple[str | None, str]:
    """The bucket a rate_limits entry's descriptor names under Tollgate's
    mapping rule, or None and why not."""
    entries = []  # descriptor entry keys, in order
    for action in actions:
        (kind, spec), = action.items()
        spec = spec or {}
        if kind == "generic_key":
            entries.append((spec.get("descriptor_key", "generic_key"), spec.get("descriptor_value")))
        elif kind == "request_headers":
            entries.append((spec["descriptor_key"], None))
        elif kind == "remote_address":
            entries.append(("remote_address", None))
        else:
            return None, f"action {kind}: the check does not know its descriptor key"
    if not entries:
        return None, "no actions"
    (key, value), rest = entries[0], entries[1:]
    if key == "generic_key":
        if not rest:
            return None, "a lone generic_key leaves nothing for the key"
        return value, ""
    return key, ""


def cmd_envoy() -> int:
    p = Problems()
    where = "envoy/envoy.yaml"
    doc = load_one(ENVOY / "envoy.yaml")
    tiers = tomllib.loads((ENVOY / "tiers.toml").read_text(encoding="utf-8"))["tiers"]
    per_key = {name for tier in tiers.values() for name, bucket in tier.get("buckets", {}).items()
               if bucket.get("kind") == "per-key"}
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}

    filters = [f for f in walk(doc) if f.get("name") == RATELIMIT_FILTER]
    if len(filters) != 1:
        p.add(where, f"expected one {RATELIMIT_FILTER} filter, found {len(filters)}")
    for f in filters:
        config = f["typed_config"]
        if not TENANT_ID.match(str(config.get("domain", ""))):
            p.add(where, f"domain {config.get('domain')!r} is not a tenant id")
        if config.get("enable_x_ratelimit_headers") != "DRAFT_VERSION_03":
            p.add(where, "enable_x_ratelimit_headers is not DRAFT_VERSION_03")
        service = config["rate_limit_service"]
        if service.get("transport_api_version") != "V3":
            p.add(where, "rate_limit_service.transport_api_version is not V3")
        name = service["grpc_service"]["envoy_grpc"]["cluster_name"]
        cluster = clusters.get(name)
        if cluster is None:
            p.add(where, f"rate_limit_service names cluster {name}, which is not defined")
            continue
        if not any("http2_protocol_options" in m for m in walk(cluster)):
            p.add(where, f"cluster {name}: no http2_protocol_options (gRPC needs HTTP/2)")
        service_doc = load_one(K8S / "service.yaml")
        namespace = load_one(K8S / "kustomization.yaml")["namespace"]
        grpc_port = next(port["port"] for port in service_doc["spec"]["ports"] if port["name"] == "grpc")
        expected = (f"{service_doc['metadata']['name']}.{namespace}.svc.cluster.local", grpc_port)
        for address in (m["socket_address"] for m in walk(cluster) if "socket_address" in m):
            found = (address.get("address"), address.get("port_value"))
            if found != expected:
                p.add(where, f"cluster {name} points at {found[0]}:{found[1]}, "
                             f"not the Kubernetes Service's gRPC port {expected[0]}:{expected[1]}")

    n_limits = 0
    for holder in walk(doc):
        for limit in holder.get("rate_limits", []) if isinstance(holder.get("rate_limits"), list) else []:
            n_limits += 1
            bucket, why = envoy_bucket(limit.get("actions", []))
            if bucket is None:
                p.add(where, f"rate_limits {limit}: {why}")
            elif bucket not in per_key:
                p.add(where, f"rate_limits entry checks bucket {bucket}, "
                             "which envoy/tiers.toml does not define as per-key")
    if n_limits == 0:
        p.add(where, "no rate_limits")

    # The docs quote both files as they are.
    guide = (ROOT / "docs" / "envoy.md").read_text(encoding="utf-8")
    for name, lang in (("envoy.yaml", "yaml"), ("tiers.toml", "toml")):
        text = (ENVOY / name).read_text(encoding="utf-8")
        if f"```{lang}\n{text}```" not in guide:
            p.add("docs/envoy.md", f"does not quote deploy/envoy/{name} as it is (in a {lang} block)")
    return p.finish(f"{len(filters)} rate limit filter, {n_limits} rate_limits entries on "
                    f"{len(per_key)} per-key buckets, quoted in docs/envoy.md")


# --------------------------------------------------------------------------
# The agent (deploy/kubernetes/agent, docs/any-language.md)

AGENT_K8S = K8S / "agent"
AGENT_GUIDE = ROOT / "docs" / "any-language.md"
AGENT_OPTION_KINDS = {"string", "bool", "integer", "duration", "mode", "loopback", "address", "number"}
# How long the agent gives open connections once SIGTERM came
# (tollgate_agent::serve::DRAIN_TIMEOUT), before its buckets' final reports.
AGENT_DRAIN_SECONDS = 10
# Kubernetes' Pod Security Standard "restricted" allows only this one to be added.
RESTRICTED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
# What the init container preparing a DaemonSet's host directories may add.
HOST_DIR_CAPABILITIES = {"CHOWN", "FOWNER"}


def load_agent_options():
    """name -> (kind, default or None), from deploy/agent-options.txt."""
    options = {}
    for line in (DEPLOY / "agent-options.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, kind, default = line.split()
            assert kind in AGENT_OPTION_KINDS, line
            options[name] = (kind, None if default == "-" else default)
    return options


def agent_option_error(kind: str, value: str) -> str | None:
    """Why `value` is not a valid value of an agent option of `kind`, or None."""
    if kind == "string":
        return None
    if kind == "bool":
        return None if value in ("", "true", "false") else "expected no value (a flag), true or false"
    if kind == "integer":
        return None if re.fullmatch(r"[0-9]+", value) and 1 <= int(value) <= 2**32 - 1 \
            else "expected an integer from 1 to 4294967295"
    if kind == "number":
        return None if re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) else "expected a number, 0 or more"
    if kind == "duration":
        return None if DURATION.match(value) else "expected a duration such as 30s"
    if kind == "mode":
        digits = value[2:] if value.startswith("0o") else value
        return None if re.fullmatch(r"[0-7]{1,4}", digits) and int(digits, 8) <= 0o777 \
            else "expected an octal file mode from 0 to 0777"
    if kind == "loopback":
        return None if re.fullmatch(r"(127\.\d+\.\d+\.\d+|\[::1\]):\d+", value) \
            else "expected a loopback address, 127.0.0.1:PORT or [::1]:PORT"
    if kind == "address":
        return None if re.fullmatch(r"(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]+\]):\d+", value) \
            else "expected an IP address and port"
    raise ValueError(kind)


def agent_settings(p: Problems, where: str, options, container, pod_env: dict) -> dict:
    """The options a container running `tollgate agent` sets (flags win over
    TOLLGATE_AGENT_* variables), each checked against deploy/agent-options.txt."""
    args = [str(a) for a in container.get("args", [])]
    if container.get("command") or args[:1] != ["agent"]:
        p.add(where, f"container {container['name']}: expected the image's entrypoint with args [agent, ...]")
        return {}
    settings = {}
    for var, value in pod_env.items():
        if var.startswith("TOLLGATE_AGENT_"):
            name = var[len("TOLLGATE_AGENT_"):].lower().replace("_", "-")
            if name not in options:
                p.add(where, f"{var}: no option {name} in deploy/agent-options.txt")
            else:
                settings[name] = value
        elif var.startswith("TOLLGATE_") and var != "TOLLGATE_NODE_NAME":
            p.add(where, f"{var}: not a variable tollgate agent reads (TOLLGATE_AGENT_*, TOLLGATE_NODE_NAME)")
    i = 1
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            p.add(where, f"argument {arg!r}: expected --OPTION")
            i += 1
            continue
        name, eq, value = arg[2:].partition("=")
        if name not in options:
            p.add(where, f"--{name}: not an option of tollgate agent (deploy/agent-options.txt)")
            i += 1
            continue
        kind, _ = options[name]
        if kind == "bool" or eq:
            i += 1
        else:
            if i + 1 >= len(args):
                p.add(where, f"--{name}: no value")
                break
            value = args[i + 1]
            i += 2
        settings[name] = value
    for name, value in settings.items():
        why = agent_option_error(options[name][0], str(value))
        if why:
            p.add(where, f"--{name} {value!r}: {why}")
    for name, (_, default) in options.items():
        if default is not None:
            settings.setdefault(name, default)
    return settings


def container_env(p: Problems, where: str, container) -> tuple[dict, dict]:
    """(variables with a value, variables from a fieldRef: name -> field path)."""
    values, fields = {}, {}
    for e in container.get("env", []):
        if "value" in e:
            values[e["name"]] = str(e["value"])
        ref = e.get("valueFrom", {}).get("fieldRef")
        if ref:
            fields[e["name"]] = ref["fieldPath"]
    return values, fields


def mounted_volume(podspec, container, path: str):
    """(volume, mount path, path inside the volume) of the mount holding
    `path`, the deepest one; (None, None, None) if no mount holds it."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            if best is None or len(root) > len(best[1]):
                volume = next((v for v in podspec.get("volumes", []) if v["name"] == mount["name"]), None)
                best = (volume, root, path[len(root) + 1:])
    return best or (None, None, None)


def probe_script(probe) -> str | None:
    command = probe.get("exec", {}).get("command", [])
    if command[:2] == ["bash", "-c"] and len(command) == 3:
        return command[2]
    return None


def check_agent_access_file(p: Problems, where: str, text: str) -> int:
    """An --access file: only [tenants.<id>] tables, each with at most one
    of token and token_file. Returns the number of tenants."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        p.add(where, f"not TOML: {e}")
        return 0
    for key in doc:
        if key != "tenants":
            p.add(where, f"{key}: unknown key (expected [tenants.<id>] tables)")
    tenants = doc.get("tenants", {})
    for tenant, rules in tenants.items():
        if not TENANT_ID.match(tenant):
            p.add(where, f"tenants.{tenant}: not a tenant id (1 to 128 characters from [A-Za-z0-9._:-])")
        if not isinstance(rules, dict):
            p.add(where, f"tenants.{tenant}: expected a table")
            continue
        for key in rules:
            if key not in ("token", "token_file"):
                p.add(where, f"tenants.{tenant}.{key}: unknown key (token, token_file)")
        if "token" in rules and "token_file" in rules:
            p.add(where, f"tenants.{tenant}: both token and token_file")
    return len(tenants)


def check_agent_pod(p: Problems, where: str, ctx: dict, podspec, agent, layout: str) -> dict:
    """Checks a pod that runs `tollgate agent` as container `agent`; layout is
    "daemonset" (host directories, the node's name) or "sidecar" (emptyDirs,
    the pod's name). Returns the agent's settings."""
    options = ctx["options"]
    values, fields = container_env(p, where, agent)
    settings = agent_settings(p, where, options, agent, values)
    if not settings:
        return settings
    psc = podspec.get("securityContext", {})

    # Who the agent is to the server: an instance id derived from a name
    # that is unique per agent and stable across its restarts.
    if "instance-id" in settings:
        p.add(where, "--instance-id: one fixed id for every agent of the "
                     f"{'DaemonSet' if layout == 'daemonset' else 'Deployment'}; derive it from the "
                     f"{'node' if layout == 'daemonset' else 'pod'}'s name instead")
    if layout == "daemonset":
        # --node-name (or TOLLGATE_AGENT_NODE_NAME with a value) wins over
        # TOLLGATE_NODE_NAME: neither may name one node for all of them.
        from_node = any(fields.get(v) == "spec.nodeName" for v in ("TOLLGATE_NODE_NAME", "TOLLGATE_AGENT_NODE_NAME"))
        if not from_node or "node-name" in settings:
            p.add(where, "the node name does not come from spec.nodeName (TOLLGATE_NODE_NAME, fieldRef)")
    else:
        name = values.get("TOLLGATE_AGENT_NODE_NAME", "")
        refs = {v for v, f in fields.items() if f == "metadata.name"}
        if fields.get("TOLLGATE_AGENT_NODE_NAME") != "metadata.name" and \
                not any(f"$({v})" in name for v in refs):
            p.add(where, "a sidecar's agent must take its name from the pod (metadata.name): "
                         "replicas on one node would share the node's instance id")

    # The server: deploy/kubernetes's Service, over TLS, its CA trusted.
    server = settings.get("server")
    if not server:
        p.add(where, "no --server (TOLLGATE_AGENT_SERVER)")
    else:
        for url in server.split(","):
            m = re.fullmatch(r"(https?)://([^:/]+):(\d+)", url)
            if not m:
                p.add(where, f"--server {url!r}: expected SCHEME://HOST:PORT")
                continue
            scheme, host, port = m.groups()
            if host not in ctx["server_hosts"] or int(port) != ctx["server_port"]:
                p.add(where, f"--server {url}: not the server's Service ({sorted(ctx['server_hosts'])[0]}:{ctx['server_port']})")
            if ctx["server_tls"] and scheme != "https":
                p.add(where, f"--server {url}: the server speaks TLS (configmap.yaml tls-cert); use https://")
        if server.startswith("https://"):
            ca = values.get("SSL_CERT_FILE")
            if not ca:
                p.add(where, "https:// without SSL_CERT_FILE: the agent would trust only the system's roots, "
                             "not the CA of the server's certificate")
            else:
                check_secret_file(p, where, ctx, podspec, agent, "SSL_CERT_FILE", ca)

    # Files it reads, in mounted volumes.
    if "pod-token-file" in settings:
        check_secret_file(p, where, ctx, podspec, agent, "--pod-token-file", settings["pod-token-file"])
    elif ctx["server_pod_tokens"]:
        p.add(where, "no --pod-token-file, and the server binds pods to tenants")
    if "access" in settings:
        volume, _, key = mounted_volume(podspec, agent, settings["access"])
        cm = ctx["configmaps"].get(volume["configMap"]["name"]) if volume and "configMap" in volume else None
        if cm is None or key not in cm.get("data", {}):
            p.add(where, f"--access {settings['access']}: no ConfigMap key mounted there")
        else:
            check_agent_access_file(p, f"{where}: --access {settings['access']}", cm["data"][key])

    # The socket and the state directory are volumes of the right kind.
    socket = settings.get("socket", "")
    socket_dir = socket.rsplit("/", 1)[0]
    for what, path in (("--socket", socket_dir), ("--state-dir", settings.get("state-dir", ""))):
        volume, root, inside = mounted_volume(podspec, agent, path)
        if volume is None:
            p.add(where, f"{what} {path}: not on a mounted volume (the root file system is read-only)")
            continue
        kind = "hostPath" if layout == "daemonset" else "emptyDir"
        if kind not in volume:
            p.add(where, f"{what} {path}: volume {volume['name']} is not a{'n' if kind == 'emptyDir' else ''} {kind}")
        if layout == "daemonset" and "hostPath" in volume and volume["hostPath"]["path"] != path:
            p.add(where, f"{what} {path}: on the node at {volume['hostPath']['path']}; keep the two paths equal "
                         "(docs/any-language.md tells the node's pods to mount that path)")
    if socket_dir == settings.get("state-dir"):
        p.add(where, "--socket's directory is --state-dir: callers would see the journal")

    # Socket callers: the socket is the agent's user's and group's, mode
    # --socket-mode; a container mounting it needs the group (or the user).
    mode = int(settings.get("socket-mode", "0660").removeprefix("0o"), 8)
    agent_sc = agent.get("securityContext", {})
    uid = agent_sc.get("runAsUser", psc.get("runAsUser"))
    gid = agent_sc.get("runAsGroup", psc.get("runAsGroup"))
    if mode & 0o007:
        p.add(where, f"--socket-mode {settings['socket-mode']}: others may call the agent; "
                     "give callers the socket's group instead")
    if mode & 0o060 != 0o060:
        p.add(where, f"--socket-mode {settings['socket-mode']}: the group cannot connect")
    socket_volume = mounted_volume(podspec, agent, socket_dir)[0]
    for c in podspec.get("containers", []) + podspec.get("initContainers", []):
        if c is agent or socket_volume is None:
            continue
        mount = next((m for m in c.get("volumeMounts", []) if m["name"] == socket_volume["name"]), None)
        if mount is None:
            continue
        if mount["mountPath"].rstrip("/") != socket_dir:
            p.add(where, f"container {c['name']}: mounts the socket's directory at {mount['mountPath']}, not {socket_dir}")
        if layout == "sidecar" and c in podspec.get("containers", []) and \
                socket not in " ".join(map(str, c.get("command", []) + c.get("args", []))):
            p.add(where, f"container {c['name']}: mounts the socket's directory but never names {socket}")
        csc = c.get("securityContext", {})
        c_uid = csc.get("runAsUser", psc.get("runAsUser"))
        groups = {csc.get("runAsGroup", psc.get("runAsGroup")), psc.get("fsGroup"), *psc.get("supplementalGroups", [])}
        if c_uid != uid and gid not in groups and c_uid != 0:
            p.add(where, f"container {c['name']}: mounts the socket but has neither the agent's user {uid} "
                         f"nor its group {gid} (fsGroup or supplementalGroups)")
    if layout == "sidecar" and not any(
            socket_volume and any(m["name"] == socket_volume["name"] for m in c.get("volumeMounts", []))
            for c in podspec.get("containers", [])):
        p.add(where, "no application container mounts the agent's socket")

    # Probes: exec over the loopback port, alive on /healthz, ready on /readyz.
    listen = settings.get("listen")
    if not listen:
        p.add(where, "no --listen 127.0.0.1:PORT for the probes (the kubelet cannot reach a Unix socket)")
    for kind, path in (("startupProbe", "/readyz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        probe = agent.get(kind)
        if probe is None:
            p.add(where, f"no {kind}")
            continue
        script = probe_script(probe)
        if script is None:
            p.add(where, f"{kind}: expected exec [bash, -c, SCRIPT] (the agent's TCP port is loopback only: "
                         "httpGet would dial the pod's IP)")
            continue
        if listen and f"/dev/tcp/{listen.rsplit(':', 1)[0].strip('[]')}/{port_of(listen)}" not in script:
            p.add(where, f"{kind}: does not connect to --listen {listen}")
        if f"GET {path} " not in script:
            p.add(where, f"{kind}: expected GET {path}")
    if podspec.get("terminationGracePeriodSeconds", 30) <= AGENT_DRAIN_SECONDS:
        p.add(where, f"terminationGracePeriodSeconds: the agent drains connections up to {AGENT_DRAIN_SECONDS} s, "
                     "then reports every bucket; give it more")

    # Security: the agent as the image's user, read-only, no capabilities.
    if psc.get("runAsNonRoot") is not True:
        p.add(where, "pod securityContext.runAsNonRoot is not true")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        p.add(where, "pod seccompProfile is not RuntimeDefault")
    if (uid, gid) != ctx["docker_user"]:
        p.add(where, f"the agent runs as {uid}:{gid}, not the Dockerfile's USER {ctx['docker_user'][0]}:{ctx['docker_user'][1]}")
    for c in podspec.get("containers", []) + podspec.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False:
            p.add(where, f"container {c['name']}: needs readOnlyRootFilesystem true, allowPrivilegeEscalation false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            p.add(where, f"container {c['name']}: does not drop ALL capabilities")
        added = set(sc.get("capabilities", {}).get("add", []))
        allowed = HOST_DIR_CAPABILITIES if layout == "daemonset" and sc.get("runAsUser") == 0 \
            else RESTRICTED_ADDED_CAPABILITIES
        if added - allowed:
            p.add(where, f"container {c['name']}: adds capabilities {sorted(added - allowed)}")
        if sc.get("runAsUser") == 0 and (layout != "daemonset" or c is agent):
            p.add(where, f"container {c['name']}: runs as root")
        if "resources" not in c or "requests" not in c["resources"]:
            p.add(where, f"container {c['name']}: no resource requests")
        image = c["image"].split(":")[0]
        if image == "tollgate" and image not in ctx["images"]:
            p.add(where, f"container {c['name']}: image {c['image']} is not in kustomization.yaml's images")
    if layout == "sidecar":
        for v in podspec.get("volumes", []):
            if "hostPath" in v:
                p.add(where, f"volume {v['name']}: hostPath, which the restricted Pod Security Standard forbids")

    if layout == "daemonset":
        # The host directories, made the agent's by a root init container.
        state = settings.get("state-dir", "")
        preparers = [c for c in podspec.get("initContainers", []) if c.get("securityContext", {}).get("runAsUser") == 0]
        script = " ".join(" ".join(map(str, c.get("command", []) + c.get("args", []))) for c in preparers)
        chowned = {path.rstrip("/") for m in re.finditer(rf"chown {uid}:{gid} ([^&;|]+)", script)
                   for path in m.group(1).split()}
        for path in (socket_dir, state):
            volume = mounted_volume(podspec, agent, path)[0]
            mounted = any(volume and any(m["name"] == volume["name"] and m["mountPath"].rstrip("/") == path
                                         for m in c.get("volumeMounts", [])) for c in preparers)
            if not mounted or path not in chowned:
                p.add(where, f"{path}: no root init container mounting it and giving it to {uid}:{gid} "
                             "(the kubelet creates host directories as root)")
    return settings


def check_secret_file(p: Problems, where: str, ctx, podspec, container, what: str, path: str) -> None:
    volume, _, key = mounted_volume(podspec, container, path)
    if volume is None or "secret" not in volume:
        p.add(where, f"{what} {path}: not in a mounted Secret")
        return
    name = volume["secret"]["secretName"]
    if name not in ctx["example_secrets"]:
        p.add(where, f"{what} {path}: Secret {name} has no *.example.yaml")
    elif key not in ctx["example_secrets"][name]:
        p.add(where, f"{what} {path}: Secret {name}'s example has no key {key}")


def agent_context(p: Problems) -> dict:
    """What the agent's manifests are checked against: the server's
    Service and configuration, the Dockerfile, the examples' Secrets."""
    service = load_one(K8S / "service.yaml")
    namespace = load_one(K8S / "kustomization.yaml")["namespace"]
    name = service["metadata"]["name"]
    config = tomllib.loads(load_one(K8S / "configmap.yaml")["data"]["tollgate.toml"])
    example_secrets = {}
    for f in sorted(AGENT_K8S.glob("*.example.yaml")):
        for doc in load_yaml(f):
            if doc.get("kind") == "Secret":
                example_secrets[doc["metadata"]["name"]] = set(doc.get("stringData", {}))
    kustomization = load_one(AGENT_K8S / "kustomization.yaml")
    return {
        "options": load_agent_options(),
        "server_hosts": {f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"},
        "server_port": next(port["port"] for port in service["spec"]["ports"] if port["name"] == "grpc"),
        "server_tls": "tls-cert" in config,
        "server_pod_tokens": "pod-tokens-file" in config,
        "docker_user": docker_user(),
        "example_secrets": example_secrets,
        "images": {i["name"] for i in kustomization.get("images", [])},
        "configmaps": {},
    }


def cmd_agent() -> int:
    p = Problems()
    ctx = agent_context(p)
    kustomization = load_one(AGENT_K8S / "kustomization.yaml")
    resources = kustomization.get("resources", [])
    examples = sorted(f.name for f in AGENT_K8S.glob("*.example.yaml"))
    docs = []
    for name in resources:
        if not (AGENT_K8S / name).exists():
            p.add("agent/kustomization.yaml", f"resource {name}: no such file")
            continue
        docs += [(name, d) for d in load_yaml(AGENT_K8S / name)]
    for name in examples:
        if name in resources:
            p.add("agent/kustomization.yaml", f"lists {name}: an example, never applied")
    for f in sorted(AGENT_K8S.glob("*.yaml")):
        if f.name not in resources and f.name != "kustomization.yaml" and f.name not in examples:
            p.add("agent/kustomization.yaml", f"does not list {f.name}")
    namespace = kustomization.get("namespace")
    namespaces = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Namespace"}
    if namespace not in namespaces:
        p.add("agent/kustomization.yaml", f"namespace {namespace}: no Namespace resource makes it")
    ctx["configmaps"] = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "ConfigMap"}

    daemonsets = [(n, d) for n, d in docs if d["kind"] == "DaemonSet"]
    if len(daemonsets) != 1:
        p.add("agent/kustomization.yaml", f"expected one DaemonSet, found {len(daemonsets)}")
    n_pods = 0
    for name, ds in daemonsets:
        where = f"agent/{name}"
        spec = ds["spec"]
        podspec = spec["template"]["spec"]
        if not subset(spec["selector"].get("matchLabels"), spec["template"]["metadata"].get("labels", {})):
            p.add(where, "selector does not match the pod template's labels")
        rolling = spec.get("updateStrategy", {}).get("rollingUpdate", {})
        if str(rolling.get("maxSurge", 0)) not in ("0", "0%"):
            p.add(where, "updateStrategy maxSurge must be 0: a node's new agent would start while the old "
                         "one holds the state directory and the socket")
        agent = next((c for c in podspec["containers"] if c["name"] == "agent"), None)
        if agent is None:
            p.add(where, "no container named agent")
            continue
        n_pods += 1
        check_agent_pod(p, where, ctx, podspec, agent, "daemonset")
        if any("hostPath" in v for v in podspec.get("volumes", [])):
            labels = namespaces.get(namespace, {}).get("metadata", {}).get("labels", {})
            if labels.get("pod-security.kubernetes.io/enforce") != "privileged":
                p.add("agent/namespace.yaml", "the DaemonSet mounts host directories, which only the "
                                              "privileged Pod Security Standard admits")

    sidecar_file = AGENT_K8S / "sidecar.example.yaml"
    for doc in load_yaml(sidecar_file):
        where = "agent/sidecar.example.yaml"
        if doc["kind"] != "Deployment":
            continue
        podspec = doc["spec"]["template"]["spec"]
        agent = next((c for c in podspec.get("initContainers", [])
                      if c.get("args", [None])[0] == "agent"), None)
        if agent is None:
            p.add(where, "no init container running tollgate agent")
            continue
        n_pods += 1
        if agent.get("restartPolicy") != "Always":
            p.add(where, f"init container {agent['name']}: restartPolicy is not Always (a native sidecar)")
        if "startupProbe" not in agent:
            p.add(where, f"init container {agent['name']}: no startupProbe, so the application may start "
                         "before the socket is there")
        check_agent_pod(p, where, ctx, podspec, agent, "sidecar")

    # The guide documents every option, the manifests' layouts and the
    # proto it links.
    guide = AGENT_GUIDE.read_text(encoding="utf-8")
    start = guide.find("\n## Running the agent\n")
    end = guide.find("\n## ", start + 1)
    rows = [line for line in guide[start:end].splitlines() if line.startswith("|")] if start >= 0 else []
    for name in ctx["options"]:
        if not any(re.search(rf"`--{re.escape(name)}\b", row) for row in rows):
            p.add("docs/any-language.md", f"the table of \"Running the agent\" does not document --{name} "
                                          "(deploy/agent-options.txt)")
    for needed in ("TOLLGATE_AGENT_", "TOLLGATE_NODE_NAME", "deploy/kubernetes/agent",
                   "proto/tollgate/agent/v1/agent.proto"):
        if needed not in guide:
            p.add("docs/any-language.md", f"does not mention {needed}")
    return p.finish(f"{len(docs)} resources in agent/kustomization.yaml and the sidecar example: "
                    f"{n_pods} agent pods' options, files, socket access, probes and security agree with "
                    "deploy/agent-options.txt, the server's Service and the Dockerfile")


def cmd_agent_probes() -> int:
    """Runs every exec probe of the agent's manifests against a local
    stand-in for the agent's loopback port: passing on 200, failing on 503
    and with nothing listening."""
    import http.server
    import subprocess
    import threading

    probes = []  # (where, kind, script, port)
    for f in [AGENT_K8S / "daemonset.yaml", AGENT_K8S / "sidecar.example.yaml"]:
        for doc in load_yaml(f):
            podspec = doc.get("spec", {}).get("template", {}).get("spec")
            if not podspec:
                continue
            for c in podspec.get("containers", []) + podspec.get("initContainers", []):
                for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                    script = probe_script(c.get(kind, {}))
                    m = script and re.search(r"/dev/tcp/127\.0\.0\.1/(\d+)", script)
                    if m:
                        probes.append((f"agent/{f.name}: {c['name']}", kind, script, m.group(1)))
    if not probes:
        print("no exec probes over /dev/tcp/127.0.0.1 found")
        return 1
    status = {"code": 200}
    paths_asked = set()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            paths_asked.add(self.path)
            code = status["code"] if self.path in ("/healthz", "/readyz") else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok\n" if code == 200 else b"not ready\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    free = server.server_port

    def run(script, port):
        local = script.replace(f"/dev/tcp/127.0.0.1/{port}", f"/dev/tcp/127.0.0.1/{free}")
        return subprocess.run(["bash", "-c", local], capture_output=True, timeout=10).returncode

    p = Problems()
    try:
        for where, kind, script, port in probes:
            status["code"] = 200
            if run(script, port) != 0:
                p.add(where, f"{kind} fails while the agent answers 200")
            status["code"] = 503
            if run(script, port) == 0:
                p.add(where, f"{kind} passes while the agent answers 503")
    finally:
        server.shutdown()
        server.server_close()
    for where, kind, script, port in probes:
        if run(script, port) == 0:
            p.add(where, f"{kind} passes while nothing listens")
    return p.finish(f"{len(probes)} probes ({', '.join(sorted(paths_asked))}): pass on 200, "
                    "fail on 503 and with nothing listening")


# --------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    commands = {
        "yaml": lambda: cmd_yaml(args),
        "dashboard": cmd_dashboard,
        "dashboard-rules": lambda: cmd_dashboard_rules(args[0]),
        "metrics": cmd_metrics,
        "kubernetes": cmd_kubernetes,
        "compose": cmd_compose,
        "compose-healthcheck": cmd_compose_healthcheck,
        "docker": cmd_docker,
        "envoy": cmd_envoy,
        "agent": cmd_agent,
        "agent-probes": cmd_agent_probes,
        "k8s-sd-stub": lambda: cmd_k8s_sd_stub(args[0], args[1]),
    }
    if cmd not in commands:
        print(__doc__)
        return 2
    try:
        return commands[cmd]()
    except (yaml.YAMLError, json.JSONDecodeError, OSError) as e:
        print(f"cannot read a file: {e}")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        # A file whose structure is not what the checks expect.
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        print(f"unexpected structure ({type(e).__name__}: {e}, at lint.py line {tb.tb_lineno})")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
