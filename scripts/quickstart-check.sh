#!/usr/bin/env bash
# quickstart-check: run the README's quickstart as a newcomer would.
#
# It clones the repository's HEAD into a temporary directory (a fresh clone:
# uncommitted changes are not part of it), builds rateleased there, starts
# it with examples/rules.yaml on a free loopback port, and runs the shell
# blocks between <!-- quickstart:begin --> and <!-- quickstart:end --> of
# the README, in order, in one bash with `set -euo pipefail`. The one
# change made to the commands is the address: localhost:8080 becomes the
# port the server got, so that the check never collides with a server
# already on 8080. It fails when any command fails. Needs git, go, curl and
# jq (`make jq` installs jq).
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=$(mktemp -d)
server_pid=
cleanup() {
	if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

for tool in git go curl jq; do
	command -v "$tool" >/dev/null || { echo "quickstart-check: $tool is missing" >&2; exit 1; }
done

git clone -q "$repo" "$work/clone"
cd "$work/clone"
mkdir -p "$work/bin"
go build -o "$work/bin/rateleased" ./server/cmd/rateleased
export PATH="$work/bin:$PATH"

# The commands, extracted: the ```sh blocks between the markers.
awk '
	/<!-- quickstart:begin -->/ { on = 1; next }
	/<!-- quickstart:end -->/   { on = 0; next }
	on && /^```sh[[:space:]]*$/ { code = 1; next }
	on && code && /^```[[:space:]]*$/ { code = 0; print ""; next }
	on && code { print }
' README.md >"$work/quickstart.sh"
if ! grep -q '[^[:space:]]' "$work/quickstart.sh"; then
	echo "quickstart-check: no \`\`\`sh block between the quickstart markers of README.md" >&2
	exit 1
fi

rateleased -rules examples/rules.yaml -listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
server_pid=$!
addr=
for _ in $(seq 1 200); do
	addr=$(sed -n 's/.*msg="rateleased listening".* addr=\([0-9.]*:[0-9]*\).*/\1/p' "$work/server.log" | head -n1)
	[ -n "$addr" ] && curl -sf "http://$addr/readyz" >/dev/null && break
	kill -0 "$server_pid" 2>/dev/null || { echo "quickstart-check: rateleased exited:" >&2; cat "$work/server.log" >&2; exit 1; }
	addr=
	sleep 0.05
done
[ -n "$addr" ] || { echo "quickstart-check: rateleased did not become ready:" >&2; cat "$work/server.log" >&2; exit 1; }

sed -i "s/localhost:8080/$addr/g" "$work/quickstart.sh"
echo "quickstart-check: running the README's quickstart against rateleased on $addr"
if ! (cd "$work/clone" && bash -euo pipefail -x "$work/quickstart.sh"); then
	echo "quickstart-check: FAILED: a command of the README's quickstart failed (above). Server log:" >&2
	cat "$work/server.log" >&2
	exit 1
fi
echo "quickstart-check: ok"
