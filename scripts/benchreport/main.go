// Command benchreport turns `go test -bench` output into BENCHMARKS.md: the
// machine, the commands, a table of every performance target of the issues
// with the measured figure, and the raw output.
//
// Usage: go run ./scripts/benchreport -out BENCHMARKS.md RUN.txt...
// where each RUN.txt starts with a line "# command: ..." naming the command
// that produced it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// target is one performance goal of an issue.
type target struct {
	issue string
	what  string
	bench string  // benchmark name (without the -N GOMAXPROCS suffix)
	unit  string  // metric unit as go test prints it
	scale float64 // figure = value * scale
	shown string  // unit of the figure
	max   bool    // true: the figure must be at most limit
	limit float64
	note  string
}

var targets = []target{
	{"#2", "decode: batch of 16 BlockStored (8 hashes, 128 tokens each), array form", "BenchmarkDecode/array", "ns/event", 1e-3, "µs/event", true, 1.5, ""},
	{"#2", "decode: the same, map form", "BenchmarkDecode/map", "ns/event", 1e-3, "µs/event", true, 1.5, ""},
	{"#2", "decode: allocations per batch", "BenchmarkDecode/array", "allocs/op", 1, "allocs", true, 0, ""},
	{"#3", "llm-d chain, 8k tokens (512 blocks of 16)", "BenchmarkChain/llmd-512x16", "ns/op", 1e-3, "µs", true, 40, "see the FNV-64a floor below"},
	{"#3", "bare FNV-64a over the same 47,104 CBOR bytes (the floor)", "BenchmarkFNV64aFloor", "ns/op", 1e-3, "µs", true, math.Inf(1), "no target: the least any llm-d chain can take"},
	{"#3", "xxh3 chain, 8k tokens", "BenchmarkChain/xxh3-512x16", "ns/op", 1e-3, "µs", true, 10, ""},
	{"#3", "llm-d chain allocations", "BenchmarkChain/llmd-512x16", "allocs/op", 1, "allocs", true, 0, ""},
	{"#4", "lookup p50, 100 pods, 512-block prompts held whole, 1M blocks", "BenchmarkLookup/1M", "p50-ns", 1e-3, "µs", true, 10, ""},
	{"#4", "lookup p50, the same with 10M blocks", "BenchmarkLookup/10M", "p50-ns", 1e-3, "µs", true, 25, ""},
	{"#4", "a plain Go map walk over the same queries, 1M blocks (the issue measured 9 µs on its machine)", "BenchmarkLookupMapBaseline/1M", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: calibrates this machine"},
	{"#4", "a plain Go map walk, 10M blocks (the issue measured 107 µs)", "BenchmarkLookupMapBaseline/10M", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: calibrates this machine"},
	{"#4", "the same queries over a bare prompt-ordered array, 1M blocks (one probe a prompt, then a sequential read; no concurrency, removal or eviction)", "BenchmarkLookupAdjacentBaseline/1M", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: the floor of the store's layout"},
	{"#4", "the same, 10M blocks", "BenchmarkLookupAdjacentBaseline/10M", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: the floor of the store's layout"},
	{"#4", "lookup p50, 1M blocks, prompts stored in interleaved pieces of 16 blocks, each after its parent (chunked prefill)", "BenchmarkLookupPieces/piece=16", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: prompts not stored whole"},
	{"#4", "the same, pieces of one block (decoding)", "BenchmarkLookupPieces/piece=1", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: prompts not stored whole"},
	{"#4", "the same, one-block pieces added without their parents (the worst case)", "BenchmarkLookupPieces/piece=1/unchained", "p50-ns", 1e-3, "µs", true, math.Inf(1), "no target: prompts not stored whole"},
	{"#4", "store apply, BlockStored + BlockRemoved", "BenchmarkApply/batch=16", "blocks/s", 1e-6, "M blocks/s", false, 3, ""},
	{"#4", "memory per block, 10M blocks with one holder", "BenchmarkMemory/10M", "heapinuse-B/block", 1, "bytes/block", true, 40, ""},
	{"#4", "indexer apply (hash check + store), engine keys", "BenchmarkApply/engine", "blocks/s", 1e-6, "M blocks/s", false, math.Inf(-1), "no target: the whole apply path"},
	{"#5", "ingest through real sockets, ~1 KiB messages, two libzmq publishers", "BenchmarkIngest/pub=libzmq-x2/buf=64KiB", "msgs/s", 1e-3, "k msgs/s", false, 250, ""},
	{"#5", "the same, one libzmq publisher", "BenchmarkIngest/pub=libzmq/buf=64KiB", "msgs/s", 1e-3, "k msgs/s", false, math.Inf(-1), "no target: the Python sender's pace, its pub-msgs/s below being the same figure"},
	{"#5", "ingest, Go ZMTP publisher", "BenchmarkIngest/pub=go-zmtp/buf=64KiB", "msgs/s", 1e-3, "k msgs/s", false, 250, ""},
	{"#6", "gRPC Match by 512 block hashes, loopback, 100 pods and 1M blocks indexed, while events are ingested: throughput", "BenchmarkGRPCMatch/hashes-512", "queries/s", 1e-3, "k queries/s", false, 20, ""},
	{"#6", "the same: p99", "BenchmarkGRPCMatch/hashes-512", "p99-ms", 1, "ms", true, 2, ""},
	{"#6", "gRPC Match by 8k token ids: throughput", "BenchmarkGRPCMatch/tokens-8k", "queries/s", 1e-3, "k queries/s", false, 5, ""},
	{"#6", "the same: p99", "BenchmarkGRPCMatch/tokens-8k", "p99-ms", 1, "ms", true, 5, ""},
	{"#5", "end to end: recording a looped through a socket, subscriber, pipeline, index", "BenchmarkEndToEnd", "blocks/s", 1e-6, "M blocks/s", false, math.Inf(-1), "no target"},
	{"#12", "decode after the newest fields: batch of 16 BlockStored (8 hashes, 128 tokens each), array form", "BenchmarkDecode/array", "ns/event", 1e-3, "µs/event", true, 0.5, ""},
	{"#12", "the same, map form", "BenchmarkDecode/map", "ns/event", 1e-3, "µs/event", true, 0.5, ""},
	{"#12", "the same, map form with a hybrid model's group_idx, kv_cache_spec_kind, sliding window, locality and ownership on every event (11 fields instead of 6)", "BenchmarkDecode/map-hybrid", "ns/event", 1e-3, "µs/event", true, math.Inf(1), "no target: the #12 target is the batch above"},
	{"#12", "decode allocations per batch, hybrid map form", "BenchmarkDecode/map-hybrid", "allocs/op", 1, "allocs", true, 0, ""},
	{"#12", "vLLM xxhash_cbor chain, 8k tokens (512 blocks of 16)", "BenchmarkChain/vllm-xxhash-cbor-512x16", "ns/op", 1e-3, "µs", true, math.Inf(1), "no target"},
	{"#13", "Redis: lookup of a 512-block prompt, 1M blocks over 100 pods, loopback redis-server: p50", "BenchmarkRedisLookup/1M", "p50-ms", 1, "ms", true, 0.5, ""},
	{"#13", "the same: p99", "BenchmarkRedisLookup/1M", "p99-ms", 1, "ms", true, 2, ""},
	{"#13", "Redis: stores, batches of 64 blocks, 100 pods", "BenchmarkRedisApply/store/batch=64", "blocks/s", 1e-3, "k blocks/s", false, 300, ""},
	{"#13", "Redis: removals, batches of 64 blocks", "BenchmarkRedisApply/remove/batch=64", "blocks/s", 1e-3, "k blocks/s", false, 300, ""},
	{"#13", "Redis: memory per (pod, block), 1M one-holder blocks (INFO memory used_memory)", "BenchmarkRedisMemory/1M", "bytes/block", 1, "bytes/block", true, 150, ""},
	{"#10", "prefixd serve's peak RSS under 300 concurrent 4 MiB /v1/match bodies", "BenchmarkQueryFlood", "peak-rss-MiB", 1, "MiB", true, 700 * 1e6 / (1 << 20), "700 MB; the query byte budget is 256 MiB"},
	{"#10", "prefixd serve's /metrics after 20,000 topics, each a pod of its own", "BenchmarkManyTopicsMetrics", "metrics-bytes", 1e-6, "MB", true, 5 * (1 << 20) * 1e-6, "5 MiB; --max-pods keeps 4096 of the pods"},
}

var lineRE = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

func main() {
	out := flag.String("out", "BENCHMARKS.md", "report to write")
	flag.Parse()
	// runs holds every run's figures by benchmark and unit; a benchmark run
	// several times (-count) is reported by its median.
	runs := map[string]map[string][]float64{}
	var commands, raw []string
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if c, ok := strings.CutPrefix(line, "# command: "); ok {
				commands = append(commands, c)
				continue
			}
			if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "goos") || strings.HasPrefix(line, "cpu:") || strings.HasPrefix(line, "pkg:") {
				raw = append(raw, line)
			}
			m := lineRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			fields := strings.Fields(m[2])
			r := runs[m[1]]
			if r == nil {
				r = map[string][]float64{}
				runs[m[1]] = r
			}
			for i := 0; i+1 < len(fields); i += 2 {
				if v, err := strconv.ParseFloat(fields[i], 64); err == nil {
					r[fields[i+1]] = append(r[fields[i+1]], v)
				}
			}
		}
		f.Close()
	}

	results := map[string]map[string]float64{}
	for bench, units := range runs {
		results[bench] = map[string]float64{}
		for unit, vs := range units {
			results[bench][unit] = median(vs)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nRegenerated by `make bench` (scripts/bench.sh) on %s.\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; %s. The machine is shared: figures move by 10-30%% between runs; a benchmark run several times (-count) is reported by its median, and the raw output lists every run.\n\n", cpuModel(), runtime.NumCPU(), memTotal(), runtime.Version())
	b.WriteString("## Targets\n\n| issue | what | target | measured | met |\n|---|---|---|---|---|\n")
	for _, t := range targets {
		r, ok := results[t.bench]
		v, ok2 := r[t.unit]
		goal := "-"
		if !math.IsInf(t.limit, 0) {
			op := "≥"
			if t.max {
				op = "≤"
			}
			goal = fmt.Sprintf("%s %s %s", op, formatLimit(t.limit), t.shown)
		}
		if !ok || !ok2 {
			fmt.Fprintf(&b, "| %s | %s | %s | not measured | no |\n", t.issue, t.what, goal)
			continue
		}
		fig := v * t.scale
		met := "yes"
		if (t.max && fig > t.limit) || (!t.max && fig < t.limit) {
			met = "**no**"
		}
		if math.IsInf(t.limit, 0) {
			met = "-"
		}
		note := ""
		if t.note != "" {
			note = " (" + t.note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s%s | %s | %s %s | %s |\n", t.issue, t.what, note, goal, format(fig), t.shown, met)
	}
	b.WriteString("\n## Commands\n\n```sh\n")
	for _, c := range commands {
		b.WriteString(c + "\n")
	}
	b.WriteString("```\n\n## Raw output\n\n```\n")
	for _, l := range raw {
		b.WriteString(l + "\n")
	}
	b.WriteString("```\n")
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		fatal(err)
	}
}

// median returns the median of vs (the mean of the middle two for an even
// count).
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// formatLimit prints a target with at most three significant digits, as
// round targets are written in the issues (1.5, 40, 250).
func formatLimit(v float64) string {
	if g := strconv.FormatFloat(v, 'g', 3, 64); !strings.ContainsRune(g, 'e') {
		return g
	}
	return format(v)
}

func format(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "memory unknown"
	}
	var kb int64
	if _, err := fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb); err != nil {
		return "memory unknown"
	}
	return fmt.Sprintf("%d GiB", (kb+512*1024)>>20)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchreport:", err)
	os.Exit(1)
}
