#!/usr/bin/env bash
# Runs every fuzz target of the module for the given time each (default 5s).
set -euo pipefail
fuzztime=${1:-5s}
cd "$(dirname "$0")/.."
grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sort | while IFS=: read -r file decl; do
	name=${decl#func }
	pkg=./$(dirname "${file#./}")
	echo "fuzz $pkg $name ($fuzztime)"
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg"
done
