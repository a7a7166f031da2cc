package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/redis"
	"github.com/prefixd/prefixd/store/storetest"
	"github.com/prefixd/prefixd/testutil/redistest"
)

// The benchmark shape is store/memory's: 100 pods, distinct prompts of
// 512 blocks, each prompt held whole by one pod, so that a lookup of a
// prompt walks all of it. Each benchmark starts its own redis-server on
// loopback; client and server share the machine's cores.
//
//	go test -run '^$' -bench 'RedisLookup' -benchtime 5000x ./store/redis/
//	go test -run '^$' -bench 'RedisApply' -benchtime 3000x ./store/redis/
//	go test -run '^$' -bench 'RedisMemory' -benchtime 1x ./store/redis/
//
// plain go test runs none of this.
const (
	benchPods   = storetest.BenchPods
	promptLen   = storetest.BenchPromptLen
	benchBlocks = 1 << 20
	// loaders is how many goroutines load an index: Redis runs one script
	// at a time, and a few connections keep it busy.
	loaders = 8
)

// applier applies batches to the benchmark's pods at consecutive seqs.
type applier struct {
	mu   sync.Mutex
	seqs map[string]uint64
}

func (ap *applier) next(pod string) uint64 {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if ap.seqs == nil {
		ap.seqs = make(map[string]uint64)
	}
	ap.seqs[pod]++
	return ap.seqs[pod]
}

func (ap *applier) apply(tb testing.TB, s store.Store, pod string, ops ...store.Op) store.Result {
	res, err := s.Apply(context.Background(), pod, &store.Batch{Seq: ap.next(pod), Ops: ops})
	if err != nil || res.Duplicate {
		tb.Fatalf("Apply(%s) = %+v, %v", pod, res, err)
	}
	return res
}

// parallel runs f(w) on n goroutines and waits.
func parallel(n int, f func(w int)) {
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() { f(w) })
	}
	wg.Wait()
}

// fill adds blocks/promptLen prompts, prompt p held by pod p%100, a batch
// a prompt, from loaders goroutines (pod p%100 always from the same one),
// and returns how long it took.
func fill(tb testing.TB, s store.Store, blocks int) time.Duration {
	start := time.Now()
	var ap applier
	parallel(loaders, func(w int) {
		buf := make([]uint64, promptLen)
		for p := w; p < blocks/promptLen; p += loaders {
			ap.apply(tb, s, storetest.BenchPodNames[p%benchPods], store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: storetest.PromptKeys(buf, p)})
		}
	})
	return time.Since(start)
}

func usedMemory(tb testing.TB, p *redistest.Process) int64 {
	v, err := redistest.Info(p.Addr(), "memory", "used_memory")
	if err != nil {
		tb.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// reportLatency reports the median and 99th percentile of d.
func reportLatency(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	b.ReportMetric(ms(d[len(d)/2]), "p50-ms")
	b.ReportMetric(ms(d[len(d)*99/100]), "p99-ms")
}

// BenchmarkRedisLookup looks up whole prompts in an index of 1Mi blocks:
// every key is walked. /filtered names all 100 pods as candidates.
func BenchmarkRedisLookup(b *testing.B) {
	p := redistest.Start(b)
	s := newStore(b, p.URL(), redis.Options{Timeout: 10 * time.Second})
	took := fill(b, s, benchBlocks)
	b.Logf("loaded %d blocks in %v (%.0f blocks/s)", benchBlocks, took, benchBlocks/took.Seconds())
	for _, bc := range []struct {
		name string
		pods []string
	}{{"1M", nil}, {"1M/filtered", storetest.BenchPodNames}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			out := make([]store.Match, 0, benchPods)
			d := make([]time.Duration, b.N)
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, promptLen)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				q := storetest.PromptKeys(buf, rng.IntN(benchBlocks/promptLen))
				t0 := time.Now()
				var err error
				out, err = s.Lookup(ctx, q, bc.pods, out)
				d[i] = time.Since(t0)
				if err != nil || len(out) != 1 || out[0].Blocks != promptLen {
					b.Fatalf("Lookup = %+v, %v; want one pod with %d blocks", out, err, promptLen)
				}
			}
			b.StopTimer()
			reportLatency(b, d)
		})
	}
}

// BenchmarkRedisApply stores, then removes, batches of new blocks, an op
// a batch, for 100 pods from loaders goroutines (a pod's batches from one
// of them, in seq order). It reports blocks/s for all goroutines together.
func BenchmarkRedisApply(b *testing.B) {
	p := redistest.Start(b)
	for _, batch := range []int{16, 64, 128} {
		var stored [][]uint64 // by batch index: what store added, for remove
		var ap applier
		s := newStore(b, p.URL(), redis.Options{Timeout: 10 * time.Second})
		keys := func(n int) []uint64 {
			ks := make([]uint64, batch)
			for j := range ks {
				ks[j] = storetest.Mix(uint64(n*batch+j) | 1<<40)
			}
			return ks
		}
		run := func(b *testing.B, kind store.OpKind, from int) {
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			parallel(loaders, func(w int) {
				for i := w; i < b.N; i += loaders {
					n := from + i
					pod := storetest.BenchPodNames[n%benchPods]
					if kind == store.OpAdd {
						ap.apply(b, s, pod, store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: stored[n]})
					} else if res := ap.apply(b, s, pod, store.Op{Kind: store.OpRemove, Tier: store.TierGPU, Keys: stored[n]}); res.Removed != batch {
						b.Errorf("Apply(remove) = %+v; want %d removed", res, batch)
						return
					}
				}
			})
			b.ReportMetric(float64(batch*b.N)/time.Since(start).Seconds(), "blocks/s")
		}
		var added int
		b.Run(fmt.Sprintf("store/batch=%d", batch), func(b *testing.B) {
			// Each run stores new batches: pods keep their seqs.
			for n := len(stored); n < added+b.N; n++ {
				stored = append(stored, keys(n))
			}
			run(b, store.OpAdd, added)
			added += b.N
		})
		b.Run(fmt.Sprintf("remove/batch=%d", batch), func(b *testing.B) {
			// Removes what the store runs added, loading more if needed.
			if b.N > added {
				for n := len(stored); n < b.N; n++ {
					stored = append(stored, keys(n))
				}
				for n := added; n < b.N; n++ {
					ap.apply(b, s, storetest.BenchPodNames[n%benchPods], store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: stored[n]})
				}
				added = b.N
			}
			run(b, store.OpRemove, added-b.N)
			added -= b.N
		})
	}
}

// BenchmarkRedisMemory reports what Redis's used_memory grows by per
// (pod, block) when 1Mi one-holder blocks are loaded, with and without a
// BlockTTL (which adds an expiry entry per block). Run it with
// -benchtime=1x.
func BenchmarkRedisMemory(b *testing.B) {
	for _, ttl := range []time.Duration{0, time.Hour} {
		name := "1M"
		if ttl > 0 {
			name += "/ttl"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				p := redistest.Start(b)
				s := newStore(b, p.URL(), redis.Options{Timeout: 10 * time.Second, BlockTTL: ttl})
				before := usedMemory(b, p)
				took := fill(b, s, benchBlocks)
				after := usedMemory(b, p)
				b.ReportMetric(float64(after-before)/benchBlocks, "bytes/block")
				b.ReportMetric(took.Seconds(), "load-s")
				ps, err := s.Pods(context.Background())
				if err != nil || len(ps) != benchPods {
					b.Fatalf("Pods = %d pods, %v", len(ps), err)
				}
				total := 0
				for _, pi := range ps {
					total += pi.Blocks
				}
				if total != benchBlocks {
					b.Fatalf("Pods counts %d blocks, want %d", total, benchBlocks)
				}
				p.Kill()
			}
		})
	}
}
