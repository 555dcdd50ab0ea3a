#!/usr/bin/env bash
# Runs a long command and prints a line every 30 s while it works, so a cold build does not look hung.
# Usage: progress.sh LABEL COMMAND [ARG...]
set -euo pipefail
label=$1
shift
start=$SECONDS
"$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' INT TERM EXIT
while kill -0 "$pid" 2>/dev/null; do
	for _ in $(seq 30); do
		sleep 1
		kill -0 "$pid" 2>/dev/null || break
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "    ... $label: still working ($((SECONDS - start)) s)"
	fi
done
trap - INT TERM EXIT
wait "$pid"
echo "    $label: done in $((SECONDS - start)) s"
