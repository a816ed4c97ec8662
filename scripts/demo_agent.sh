#!/usr/bin/env bash
# `make demo-agent`: serve the bundled agent pair (laguna-tiny-agent) on a free loopback port,
# let examples/agent.py solve the pair's 10 held-out tasks with its tools (each task with and
# without speculation: accepted tokens per round and speedup per turn), then stop the server.
# Arguments go to examples/agent.py (e.g. --thinking, --stream). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp "${TMPDIR:-/tmp}/laguna-demo-agent.XXXXXX")
.venv/bin/laguna-run serve --bundled agent --host 127.0.0.1 --port 0 2>"$log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT

# the server prints its address once the pair is loaded (the first run converts the drafter)
url=""
until [ -n "$url" ]; do
    if ! kill -0 "$server" 2>/dev/null; then
        cat "$log" >&2
        exit 1
    fi
    sleep 0.5
    url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log")
done
.venv/bin/python - "$url/health" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"demo_agent.sh: {sys.argv[1]} did not answer within 60 s")
    time.sleep(0.2)
PY
.venv/bin/python examples/agent.py --held-out --base-url "$url/v1" "$@"
