#!/usr/bin/env bash
# Runs every fuzz target of the module for the given budget each: a count of
# inputs (default 50000x) or a duration (10m). Go 1.26's fuzzer can fail a
# duration-bounded run with "context deadline exceeded" when its workers
# are slow to stop at the deadline (golang/go#75804, fixed in Go 1.27); a
# count has no deadline, so the default is one.
set -euo pipefail
fuzztime=${1:-50000x}
cd "$(dirname "$0")/.."
grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sort | while IFS=: read -r file decl; do
	name=${decl#func }
	pkg=./$(dirname "${file#./}")
	echo "fuzz $pkg $name ($fuzztime)"
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg"
done
