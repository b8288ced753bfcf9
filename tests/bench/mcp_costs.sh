#!/bin/bash
# Server CPU per request of the mcp family's routes, from outside: a fresh
# `marketplace serve` (testing routes on) on a fresh data dir, `wrk` (one
# thread, 4 connections, 5 s a route) from its own process, and the
# server's utime + stime from /proc/<pid>/stat divided by the requests
# answered. Then 8 macro runs at once (each may touch megabytes of its
# instance's memory) and the cheap calls again: what the pooled slots keep
# resident after them.
#
#   tests/bench/mcp_costs.sh [BIN] [PLUGINS_DIR] [PORT]
#   (defaults: target/release/marketplace target/plugins 18121; run from
#   the workspace root; needs wrk and curl)
set -euo pipefail
bin=${1:-target/release/marketplace}
plugins=${2:-target/plugins}
port=${3:-18121}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
printf 'testing_routes = true\n' > "$work/config.toml"
"$bin" serve --listen 127.0.0.1:$port --data-dir "$work/data" --plugins "$plugins" \
  --config "$work/config.toml" > "$work/server.log" 2>&1 &
server=$!
# Every family compiled and serving, then a settle (components compiled in
# the background would share the cores).
for _ in $(seq 300); do
  curl -sf -o /dev/null http://127.0.0.1:$port/api/health && break
  sleep 1
done
sleep 12
base=http://127.0.0.1:$port
json='-H content-type:application/json -H accept:application/json,text/event-stream'
curl -s -o /dev/null $json -d '{"name":"bench_macro","kind":"search","description":"d","typescript":"let a=[]; for (let i=0;i<20000;i++){a.push(\"x\"+i)} return {term: args.q + a.length};","input_schema":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}' \
  $base/api/mcp/tools/define

cpu() { # label url [lua]
  local stat=/proc/$server/stat tck
  tck=$(getconf CLK_TCK)
  local before after out n
  before=$(awk '{print $14 + $15}' $stat)
  if [ -n "${3:-}" ]; then out=$(wrk -t1 -c4 -d5s -s "$here/mcp/$3" "$2"); else out=$(wrk -t1 -c4 -d5s "$2"); fi
  after=$(awk '{print $14 + $15}' $stat)
  n=$(echo "$out" | awk '/requests in/{print $1}')
  echo "$out" | grep -q "Non-2xx" && echo "$1: some answers were not 2xx" >&2
  python3 -c "print(f'{\"$1\":40} {($after - $before) / $tck / $n * 1e6:8.1f} µs/request')"
}
cpu "GET /_testing/ok" $base/_testing/ok
cpu "POST /mcp ping" $base/mcp ping.lua
cpu "POST /mcp tools/list" $base/mcp list.lua
cpu "POST /mcp tools/call search" $base/mcp call.lua
cpu "GET /api/mcp" $base/api/mcp
cpu "GET /api/docs/search?q=contract" "$base/api/docs/search?q=contract"
cpu "POST /mcp ping, after the above" $base/mcp ping.lua
pids=""
for _ in $(seq 8); do
  curl -s -o /dev/null $json -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bench_macro","arguments":{"q":"bike"}}}' $base/mcp &
  pids="$pids $!"
done
wait $pids
cpu "POST /mcp ping, after 8 macro runs" $base/mcp ping.lua
cpu "POST /mcp tools/call, after them" $base/mcp call.lua
