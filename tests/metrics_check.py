"""Scrape the built host's /metrics with the Prometheus Python client's
parsers: every sample parses (the Prometheus text parser, and the stricter
OpenMetrics parser, since the body is served as OpenMetrics), the metric
families have the types they claim, and the requests counter of a route
moves by exactly the requests made. Run by .ci/run after the tests
(`pip install prometheus_client`).
"""
import math
import sys
import urllib.error
import urllib.request

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from service import running

# The host refuses an admin token shorter than 32 bytes.
TOKEN = "metrics-check-token-0123456789abcdef"


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def scrape(admin):
    status, headers, body = get(admin + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    if status != 200:
        sys.exit(f"GET /metrics with the token: {status} {body[:200]!r}")
    kind = headers.get("content-type", "")
    if not kind.startswith("application/openmetrics-text"):
        sys.exit(f"/metrics is served as {kind!r}")
    return body.decode()


def parse(text):
    """{(sample name, sorted labels): value} from the Prometheus text parser,
    after checking every sample has a number, and that the OpenMetrics
    parser reads the same samples."""
    lax = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if isinstance(s.value, bool) or not isinstance(s.value, (int, float)) \
                    or math.isnan(s.value):
                sys.exit(f"sample {s.name}{s.labels} has value {s.value!r}")
            if not s.name.startswith("marketplace_"):
                sys.exit(f"sample {s.name} lacks the marketplace_ prefix")
            lax[(s.name, tuple(sorted(s.labels.items())))] = s.value
    strict = {}
    types = {}
    try:
        for family in openmetrics_families(text):
            types[family.name] = family.type
            for s in family.samples:
                strict[(s.name, tuple(sorted(s.labels.items())))] = s.value
    except ValueError as e:
        sys.exit(f"the OpenMetrics parser refused /metrics: {e}\n{text}")
    if lax != strict:
        only = set(lax) ^ set(strict)
        sys.exit(f"the two parsers read different samples: {sorted(only)[:10]}")
    return lax, types


def value(samples, name, **labels):
    return sum(
        v for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == w for k, w in labels.items())
    )


with running(admin_token=TOKEN) as (base, admin):
    status, _, _ = get(admin + "/metrics")
    if status != 401:
        sys.exit(f"GET /metrics without the token: {status}, expected 401")

    before, _ = parse(scrape(admin))
    for _ in range(3):
        get(base + "/api/health")
    status, _, _ = get(base + "/api/no-such-route")
    if status != 404:
        sys.exit(f"GET /api/no-such-route: {status}")
    text = scrape(admin)
    after, types = parse(text)

    want = {
        "marketplace_requests": "counter",
        "marketplace_request_duration_seconds": "histogram",
        "marketplace_commits": "counter",
        "marketplace_fsyncs": "counter",
        "marketplace_commit_batch_size": "histogram",
        "marketplace_connections_open": "gauge",
        "marketplace_requests_in_flight": "gauge",
        "marketplace_ledger_minted_units": "gauge",
    }
    for name, typ in want.items():
        if types.get(name) != typ:
            sys.exit(f"{name} is {types.get(name)!r}, expected {typ}\n{text}")

    health = dict(family="host", route="/api/health", status="200")
    moved = value(after, "marketplace_requests_total", **health) - value(
        before, "marketplace_requests_total", **health)
    if moved != 3:
        sys.exit(f"requests_total{health} moved by {moved}, expected 3\n{text}")
    missing = dict(family="-", route="-", status="404")
    moved = value(after, "marketplace_requests_total", **missing) - value(
        before, "marketplace_requests_total", **missing)
    if moved != 1:
        sys.exit(f"requests_total{missing} moved by {moved}, expected 1\n{text}")
    count = dict(family="host", route="/api/health")
    moved = value(after, "marketplace_request_duration_seconds_count", **count) - value(
        before, "marketplace_request_duration_seconds_count", **count)
    if moved != 3:
        sys.exit(f"request_duration_seconds_count{count} moved by {moved}, expected 3")

print(f"metrics: {len(after)} samples in {len(types)} families parse (Prometheus text and "
      f"OpenMetrics parsers); requests_total for /api/health moved by 3")
