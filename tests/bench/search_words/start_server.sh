#!/bin/bash
# usage: start_server.sh PLUGIN_DIR DATA_DIR PORT ADMIN_PORT LOGFILE  -> prints pid
MARKETPLACE_LOG=warn nohup ${SERVER_BIN:-$(dirname "$0")/../../../target/release/marketplace} serve --listen 127.0.0.1:$3 --data-dir "$2" \
  --plugins "$1" --admin-listen 127.0.0.1:$4 >"$5" 2>&1 &
pid=$!
for i in $(seq 1 1200); do
  curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$3/api/health 2>/dev/null | true; curl -s http://127.0.0.1:$3/api/health 2>/dev/null | grep -q "},\"status\":\"ok\",\"storage" && break
  sleep 0.1
done
echo $pid
