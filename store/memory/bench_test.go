package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
	"github.com/prefixd/prefixd/store/storetest"
)

// The benchmark shape is storetest's: 100 pods, distinct prompts of 512 blocks, each
// prompt held whole by one pod, so a lookup of a prompt walks all of it.
// Run on one core:
//
//	go test -run '^$' -bench 'Lookup' -cpu 1 -benchtime 20000x ./store/memory/
//	go test -run '^$' -bench 'Apply' -cpu 1 -benchtime 2s ./store/memory/
//	go test -run '^$' -bench 'Memory' -cpu 1 -benchtime 1x ./store/memory/
//
// The 10M cases build ten million blocks (seconds, about 330 MB), once per
// process; plain go test runs none of this.
const (
	benchPods   = storetest.BenchPods
	promptLen   = storetest.BenchPromptLen
	benchApplyN = 1 << 20
)

// fill adds blocks/promptLen prompts to s, prompt p held by pod p%100,
// a batch a prompt.
func fill(tb testing.TB, s store.Store, blocks int) {
	buf := make([]uint64, promptLen)
	var ap applier
	for p := range blocks / promptLen {
		ap.apply(tb, s, p%benchPods, store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: storetest.PromptKeys(buf, p)})
	}
}

// applier applies ops to the benchmark's pods, an op a batch, each pod's
// batches at consecutive seqs. It allocates nothing.
type applier struct {
	names []string // storetest.BenchPodNames when nil
	seqs  []uint64 // by pod index
	b     store.Batch
	ops   [1]store.Op
}

// apply applies op as pod's next batch and returns what Apply did.
func (ap *applier) apply(tb testing.TB, s store.Store, pod int, op store.Op) store.Result {
	names := ap.names
	if names == nil {
		names = storetest.BenchPodNames
	}
	if ap.seqs == nil {
		ap.seqs = make([]uint64, len(names))
		ap.b.Ops = ap.ops[:]
	}
	ap.seqs[pod]++
	ap.b.Seq, ap.ops[0] = ap.seqs[pod], op
	res, err := s.Apply(context.Background(), names[pod], &ap.b)
	if err != nil || res.Duplicate {
		tb.Fatalf("Apply(%s) = %+v, %v", names[pod], res, err)
	}
	return res
}

type benchIndex struct {
	s       *memory.Store
	m       map[uint64]uint16 // the same blocks in a plain map, for comparison
	prompts int
}

// query writes the keys of a random prompt of the index into buf. It is
// not timed: a lookup's own keys are in cache, as the indexer just
// computed them, but the index is not.
func (ix *benchIndex) query(rng *rand.Rand, buf []uint64) []uint64 {
	return storetest.PromptKeys(buf, rng.IntN(ix.prompts))
}

var (
	benchMu      sync.Mutex
	benchIndexes = map[int]*benchIndex{}
)

// index returns a store of the given size, built once per process. Its
// capacity is twice that, so it is not under pressure: lookups do not keep
// eviction ages (BenchmarkLookupNearCapacity measures what that costs).
func index(b *testing.B, blocks int, withMap bool) *benchIndex {
	benchMu.Lock()
	defer benchMu.Unlock()
	ix := benchIndexes[blocks]
	if ix == nil {
		s, err := memory.New(memory.Options{CapacityBlocks: 2 * blocks})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		fill(b, s, blocks)
		b.Logf("built %d blocks in %v: %+v", blocks, time.Since(start), s.Stats())
		ix = &benchIndex{s: s, prompts: blocks / promptLen}
		benchIndexes[blocks] = ix
	}
	if withMap && ix.m == nil {
		ix.m = make(map[uint64]uint16, blocks)
		buf := make([]uint64, promptLen)
		for p := range blocks / promptLen {
			for _, k := range storetest.PromptKeys(buf, p) {
				ix.m[k] = uint16(p % benchPods)
			}
		}
	}
	runtime.GC() // not during the measurement
	return ix
}

var sizes = []struct {
	name   string
	blocks int
}{{"1M", 1 << 20}, {"10M", 10_000_000}}

// reportLatency reports the median and 99th percentile of d.
func reportLatency(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
}

// timeLookups looks up b.N random whole prompts of ix for candidates pods
// (all when nil), checks that each matches one pod whole, and reports the
// latency percentiles.
func timeLookups(b *testing.B, ix *benchIndex, pods []string) {
	ctx := context.Background()
	out := make([]store.Match, 0, benchPods)
	d := make([]time.Duration, b.N)
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]uint64, promptLen)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		q := ix.query(rng, buf)
		t0 := time.Now()
		out, _ = ix.s.Lookup(ctx, q, pods, out)
		d[i] = time.Since(t0)
		if len(out) != 1 || out[0].Blocks != promptLen {
			b.Fatalf("Lookup = %+v, want one pod with %d blocks", out, promptLen)
		}
	}
	b.StopTimer()
	reportLatency(b, d)
}

// BenchmarkLookup looks up whole prompts: every key is walked.
func BenchmarkLookup(b *testing.B) {
	for _, size := range sizes {
		b.Run(size.name, func(b *testing.B) {
			timeLookups(b, index(b, size.blocks, false), nil)
		})
	}
}

// BenchmarkLookupPieces is BenchmarkLookup/1M with prompts stored in
// pieces of 16 blocks (as chunked prefill stores them) or of one block
// (as decoding does), the pieces of different prompts interleaved. Each
// piece but the first is added after its parent, as the indexer does for
// a BlockStored event with a parent; /unchained adds them without their
// parent, the worst case.
func BenchmarkLookupPieces(b *testing.B) {
	for _, bc := range []struct {
		piece   int
		chained bool
	}{{16, true}, {1, true}, {1, false}} {
		piece := bc.piece
		name := fmt.Sprintf("piece=%d", piece)
		if !bc.chained {
			name += "/unchained"
		}
		b.Run(name, func(b *testing.B) {
			const blocks = 1 << 20
			s, err := memory.New(memory.Options{CapacityBlocks: 2 * blocks})
			if err != nil {
				b.Fatal(err)
			}
			prompts := blocks / promptLen
			buf := make([]uint64, promptLen)
			var ap applier
			for at := 0; at < promptLen; at += piece {
				for p := range prompts {
					all := storetest.PromptKeys(buf, p)
					op := store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: all[at : at+piece]}
					if bc.chained && at > 0 {
						op.Parent, op.HasParent = all[at-1], true
					}
					ap.apply(b, s, p%benchPods, op)
				}
			}
			runtime.GC()
			timeLookups(b, &benchIndex{s: s, prompts: prompts}, nil)
		})
	}
}

// BenchmarkLookupCached looks up one prompt over and over: everything it
// touches is in cache, so this is the lookup's own cost.
func BenchmarkLookupCached(b *testing.B) {
	s, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	q := storetest.PromptKeys(make([]uint64, promptLen), 0)
	var ap applier
	ap.apply(b, s, 0, store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: q})
	out := make([]store.Match, 0, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		out, _ = s.Lookup(context.Background(), q, nil, out)
	}
}

// BenchmarkLookupNearCapacity is BenchmarkLookup/1M on a store 80% full:
// lookups set the eviction age of the blocks they match, a locked write
// per block on the first lookup of a prompt after eviction counted its
// age down.
func BenchmarkLookupNearCapacity(b *testing.B) {
	const blocks = 1 << 20
	s, err := memory.New(memory.Options{CapacityBlocks: blocks + blocks/4})
	if err != nil {
		b.Fatal(err)
	}
	fill(b, s, blocks)
	runtime.GC()
	timeLookups(b, &benchIndex{s: s, prompts: blocks / promptLen}, nil)
}

// BenchmarkLookupFiltered is BenchmarkLookup/1M with all 100 pods named as
// candidates.
func BenchmarkLookupFiltered(b *testing.B) {
	timeLookups(b, index(b, 1<<20, false), storetest.BenchPodNames)
}

// BenchmarkLookupMapBaseline walks the same queries through a plain
// map[uint64]uint16: the floor a simple index starts from.
func BenchmarkLookupMapBaseline(b *testing.B) {
	for _, size := range sizes {
		b.Run(size.name, func(b *testing.B) {
			ix := index(b, size.blocks, true)
			d := make([]time.Duration, b.N)
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, promptLen)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				q := ix.query(rng, buf)
				t0 := time.Now()
				n := 0
				pod, ok := ix.m[q[0]]
				for _, k := range q {
					if p, ok2 := ix.m[k]; !ok2 || p != pod {
						break
					}
					n++
				}
				d[i] = time.Since(t0)
				if !ok || n != promptLen {
					b.Fatalf("walked %d blocks, want %d", n, promptLen)
				}
			}
			b.StopTimer()
			reportLatency(b, d)
		})
	}
}

// adjacentIndex is the same blocks laid out by prompt: an array of (key,
// pod) records in the order prompts were added, and an open-addressing
// table from key to record. A walk checks the record after the last one
// matched before it probes the table, so a prompt held whole costs one
// probe and a sequential read. It has no concurrency, removal or eviction:
// it only measures what keeping a prompt's blocks together buys on this
// machine, against the store's one probe per key.
type adjacentIndex struct {
	recs []adjacentRec
	slot []uint64 // 1 + record index, 0 for empty
	mask uint64
}

type adjacentRec struct {
	key uint64
	pod uint64
}

func newAdjacentIndex(blocks int) *adjacentIndex {
	n := uint64(1)
	for n*6 < uint64(blocks)*10 {
		n <<= 1
	}
	ix := &adjacentIndex{recs: make([]adjacentRec, 0, blocks), slot: make([]uint64, n), mask: n - 1}
	buf := make([]uint64, promptLen)
	for p := range blocks / promptLen {
		for _, k := range storetest.PromptKeys(buf, p) {
			ix.recs = append(ix.recs, adjacentRec{k, uint64(p % benchPods)})
			j := storetest.Mix(k) & ix.mask
			for ix.slot[j] != 0 {
				j = (j + 1) & ix.mask
			}
			ix.slot[j] = uint64(len(ix.recs))
		}
	}
	return ix
}

func (ix *adjacentIndex) find(k uint64) (int, bool) {
	for j := storetest.Mix(k) & ix.mask; ix.slot[j] != 0; j = (j + 1) & ix.mask {
		if r := int(ix.slot[j] - 1); ix.recs[r].key == k {
			return r, true
		}
	}
	return 0, false
}

// walk returns how many leading keys of q the pod of q[0] holds.
func (ix *adjacentIndex) walk(q []uint64) int {
	r, ok := ix.find(q[0])
	if !ok {
		return 0
	}
	pod := ix.recs[r].pod
	n := 1
	for _, k := range q[1:] {
		if r+1 < len(ix.recs) && ix.recs[r+1].key == k {
			r++
		} else if r, ok = ix.find(k); !ok {
			break
		}
		if ix.recs[r].pod != pod {
			break
		}
		n++
	}
	return n
}

// BenchmarkLookupAdjacentBaseline walks the same queries through
// adjacentIndex: the floor of an index that keeps a prompt's blocks
// together, where the store and the map pay a cache miss a key.
func BenchmarkLookupAdjacentBaseline(b *testing.B) {
	for _, size := range sizes {
		b.Run(size.name, func(b *testing.B) {
			ix := newAdjacentIndex(size.blocks)
			runtime.GC()
			d := make([]time.Duration, b.N)
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, promptLen)
			prompts := size.blocks / promptLen
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				q := storetest.PromptKeys(buf, rng.IntN(prompts))
				t0 := time.Now()
				n := ix.walk(q)
				d[i] = time.Since(t0)
				if n != promptLen {
					b.Fatalf("walked %d blocks, want %d", n, promptLen)
				}
			}
			b.StopTimer()
			reportLatency(b, d)
		})
	}
}

// BenchmarkApply adds and removes blocks at a steady size of 1Mi blocks:
// each op stores batch new blocks for a pod and removes the batch stored
// benchApplyN/batch ops earlier, as BlockStored and BlockRemoved do, each
// a batch of its own (two Applies an op).
func BenchmarkApply(b *testing.B) {
	for _, batch := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s, err := memory.New(memory.Options{CapacityBlocks: 2 * benchApplyN})
			if err != nil {
				b.Fatal(err)
			}
			keys := func(buf []uint64, n int) []uint64 {
				for j := range buf {
					buf[j] = storetest.Mix(uint64(n*batch + j))
				}
				return buf
			}
			add, rm := make([]uint64, batch), make([]uint64, batch)
			lag := benchApplyN / batch
			var ap applier
			for n := range lag {
				ap.apply(b, s, n%benchPods, store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys(add, n)})
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				n := lag + i
				ap.apply(b, s, n%benchPods, store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys(add, n)})
				if res := ap.apply(b, s, i%benchPods, store.Op{Kind: store.OpRemove, Tier: store.TierGPU, Keys: keys(rm, i)}); res.Removed != batch {
					b.Fatalf("Apply(remove) = %+v; want %d removed", res, batch)
				}
			}
			b.ReportMetric(float64(2*batch*b.N)/time.Since(start).Seconds(), "blocks/s")
		})
	}
}

// BenchmarkApplyFull adds blocks to a full store of 1Mi blocks: every
// block stored evicts one. The 100 pods take turns, so each holds its
// fair share, give or take a block.
func BenchmarkApplyFull(b *testing.B) {
	benchApplyFull(b, nil, func(n int) int { return n % benchPods })
}

// BenchmarkApplyFullFlood is BenchmarkApplyFull with one pod adding as
// much as the 100 others together: it is over its fair share, and its own
// blocks make room.
func BenchmarkApplyFullFlood(b *testing.B) {
	names := append(slices.Clone(storetest.BenchPodNames), "flood")
	benchApplyFull(b, names, func(n int) int {
		if n%2 == 0 {
			return benchPods
		}
		return n / 2 % benchPods
	})
}

// BenchmarkApplyFullManyPods is BenchmarkApplyFull with 4000 pods taking
// turns: a shard that looks for the pod most over its share looks at
// every pod it has blocks of.
func BenchmarkApplyFullManyPods(b *testing.B) {
	names := make([]string, 4000)
	for i := range names {
		names[i] = fmt.Sprintf("10.1.%d.%d:8000", i/256, i%256)
	}
	benchApplyFull(b, names, func(n int) int { return n % len(names) })
}

// benchApplyFull fills a store of 1Mi blocks twice over, then adds b.N
// batches of 16 new blocks, batch n by names[pod(n)] (storetest.BenchPodNames when
// names is nil).
func benchApplyFull(b *testing.B, names []string, pod func(n int) int) {
	const batch = 16
	s, err := memory.New(memory.Options{CapacityBlocks: benchApplyN})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]uint64, batch)
	ap := applier{names: names}
	addN := func(n int) {
		for j := range buf {
			buf[j] = storetest.Mix(uint64(n*batch + j))
		}
		ap.apply(b, s, pod(n), store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: buf})
	}
	for n := range 2 * benchApplyN / batch {
		addN(n)
	}
	ev := s.Stats().Evicted
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		addN(2*benchApplyN/batch + i)
	}
	b.ReportMetric(float64(batch*b.N)/time.Since(start).Seconds(), "blocks/s")
	b.ReportMetric(float64(s.Stats().Evicted-ev)/float64(b.N*batch), "evictions/block")
}

// BenchmarkMemory reports the heap a store of one-holder blocks uses, per
// block. Run it with -benchtime=1x.
func BenchmarkMemory(b *testing.B) {
	for _, size := range sizes {
		b.Run(size.name, func(b *testing.B) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s, err := memory.New(memory.Options{CapacityBlocks: 2 * size.blocks})
			if err != nil {
				b.Fatal(err)
			}
			fill(b, s, size.blocks)
			runtime.GC()
			runtime.ReadMemStats(&after)
			st := s.Stats()
			runtime.KeepAlive(s)
			n := float64(st.Blocks)
			b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n, "heapinuse-B/block")
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heapalloc-B/block")
			b.ReportMetric(float64(st.Bytes)/n, "estimate-B/block")
			if st.Blocks != size.blocks/promptLen*promptLen || st.Evicted != 0 {
				b.Fatalf("stats %+v after adding %d blocks", st, size.blocks)
			}
		})
	}
}

// BenchmarkMemoryEnginePairs is BenchmarkMemory/1M in tokens key mode:
// every block is stored with its engine hash, so the pods' engine-hash
// maps hold a pair a block. It reports the heap per block, pairs
// included, and the pairs' share of it apart.
func BenchmarkMemoryEnginePairs(b *testing.B) {
	const blocks = 1 << 20
	measure := func(pairs bool) (float64, memory.Stats) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s, err := memory.New(memory.Options{CapacityBlocks: 2 * blocks})
		if err != nil {
			b.Fatal(err)
		}
		buf, eng := make([]uint64, promptLen), make([]uint64, promptLen)
		var ap applier
		for p := range blocks / promptLen {
			op := store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: storetest.PromptKeys(buf, p)}
			if pairs {
				for j, k := range op.Keys {
					eng[j] = ^k
				}
				op.Engine = eng
			}
			ap.apply(b, s, p%benchPods, op)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := s.Stats()
		runtime.KeepAlive(s)
		return float64(after.HeapInuse - before.HeapInuse), st
	}
	for range b.N {
		plain, _ := measure(false)
		with, st := measure(true)
		if st.EnginePairs != blocks || st.Blocks != blocks {
			b.Fatalf("stats %+v", st)
		}
		n := float64(st.Blocks)
		b.ReportMetric(with/n, "heapinuse-B/block")
		b.ReportMetric((with-plain)/n, "pairs-B/block")
		b.ReportMetric(float64(st.Bytes)/n, "estimate-B/block")
	}
}

// BenchmarkLookupVsMap alternates a Lookup and the same walk through a
// plain map on the same query, so both see the same machine; it reports
// the ratio of their medians (store/map).
func BenchmarkLookupVsMap(b *testing.B) {
	for _, size := range sizes {
		b.Run(size.name, func(b *testing.B) {
			ix := index(b, size.blocks, true)
			ctx := context.Background()
			out := make([]store.Match, 0, benchPods)
			ds, dm := make([]time.Duration, b.N), make([]time.Duration, b.N)
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, promptLen)
			b.ResetTimer()
			for i := range b.N {
				q := ix.query(rng, buf)
				t0 := time.Now()
				out, _ = ix.s.Lookup(ctx, q, nil, out)
				ds[i] = time.Since(t0)
				q = ix.query(rng, buf)
				t0 = time.Now()
				pod := ix.m[q[0]]
				for _, k := range q {
					if p, ok := ix.m[k]; !ok || p != pod {
						break
					}
				}
				dm[i] = time.Since(t0)
			}
			b.StopTimer()
			slices.Sort(ds)
			slices.Sort(dm)
			b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "store-p50-ns")
			b.ReportMetric(float64(dm[len(dm)/2].Nanoseconds()), "map-p50-ns")
			b.ReportMetric(float64(ds[len(ds)/2])/float64(dm[len(dm)/2]), "ratio")
		})
	}
}
