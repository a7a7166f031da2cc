#!/usr/bin/env bash
# Runs prefixd's benchmarks on one core and regenerates BENCHMARKS.md.
# BENCH_QUICK=1 skips the 10M-block store benchmarks (several GiB, minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=0
bench() { # bench PKG REGEX BENCHTIME [COUNT]
	n=$((n + 1))
	local cmd="go test -run '^\$' -bench '$2' -benchtime $3 -benchmem -cpu 1 -count ${4:-1} $1"
	echo "$cmd" >&2
	{ echo "# command: $cmd"; eval "$cmd"; } | tee "$out/$n.txt" | grep -E '^Benchmark' >&2
}
# Decoding is fast enough for the machine's drift to matter: its median
# of seven runs is reported.
bench ./events/ '^BenchmarkDecode$' 1s 7
bench ./indexer/blockhash/ '^Benchmark(Chain|FNV64aFloor)$' 2000x
bench ./indexer/ '^Benchmark(Apply|MatchTokens)$' 1s
if [ "${BENCH_QUICK:-}" = 1 ]; then
	bench ./store/memory/ '^Benchmark(Lookup|LookupMapBaseline|LookupAdjacentBaseline|LookupPieces|Memory)$/1M|^BenchmarkLookupPieces$|^BenchmarkApply$' 1s
else
	bench ./store/memory/ '^Benchmark(Lookup|LookupMapBaseline|LookupAdjacentBaseline|LookupPieces|Memory|Apply)$' 1s
fi
# The Redis store against a redis-server on loopback, started by the
# benchmarks.
bench ./store/redis/ '^BenchmarkRedis(Lookup|Apply)$' 1s
bench ./store/redis/ '^BenchmarkRedisMemory$' 1x
bench ./events/transport/ '^BenchmarkIngest$' 200000x
bench ./indexer/ingest/ '^BenchmarkEndToEnd$' 50000x
# prefixd serve as a process, under hostile input: memory and /metrics size.
bench ./cmd/prefixd/ '^Benchmark(QueryFlood|ManyTopicsMetrics)$' 1x
# The query load runs on both cores: client and server share the machine.
n=$((n + 1))
cmd="go test -run '^\$' -bench '^BenchmarkGRPCMatch$' -benchtime 5s -benchmem -cpu 2 -count 1 ./rpc/"
echo "$cmd" >&2
{ echo "# command: $cmd"; eval "$cmd"; } | tee "$out/$n.txt" | grep -E '^Benchmark' >&2
go run ./scripts/benchreport -out BENCHMARKS.md "$out"/*.txt
echo "wrote BENCHMARKS.md" >&2
