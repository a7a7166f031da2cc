package memory_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
	"github.com/prefixd/prefixd/store/storetest"
)

func newStore(t testing.TB, opts memory.Options) *memory.Store {
	t.Helper()
	s, err := memory.New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, memory.Options{}) })
}

// TestConformanceBounded runs the suite on a small store, so that its
// capacity check fills it and the other subtests run on few shards.
func TestConformanceBounded(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, memory.Options{CapacityBlocks: 1 << 14}) })
}

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		opts memory.Options
		ok   bool
	}{
		{memory.Options{}, true},
		{memory.Options{Shards: 1, CapacityBlocks: 1}, true},
		{memory.Options{Shards: 1 << 16}, true},
		{memory.Options{Shards: 3}, false},
		{memory.Options{Shards: -4}, false},
		{memory.Options{Shards: 1 << 17}, false},
		{memory.Options{CapacityBlocks: -1}, false},
		{memory.Options{CapacityBlocks: memory.MaxCapacityBlocks}, true},
	} {
		err := tc.opts.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, memory.ErrInvalidOptions)) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.opts, err, tc.ok)
		}
		if _, err := memory.New(tc.opts); (err == nil) != tc.ok {
			t.Errorf("New(%+v) = %v, want ok=%v", tc.opts, err, tc.ok)
		}
	}

	var o memory.Options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--store-capacity-blocks=1000", "--store-shards=8"}); err != nil {
		t.Fatal(err)
	}
	if o.CapacityBlocks != 1000 || o.Shards != 8 {
		t.Fatalf("flags gave %+v", o)
	}
}

// TestTooManyPods fills the store with MaxPods pods: another is refused,
// whole, until a pod is forgotten. A pod that holds nothing but has a seq
// or a stale mark counts; one left with nothing at all does not.
func TestTooManyPods(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memory.Options{})
	pod := func(i int) string { return fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256) }
	for i := range memory.MaxPods {
		if err := testAdd(s, pod(i), store.TierGPU, []uint64{uint64(i)}); err != nil {
			t.Fatalf("Add for pod %d: %v", i, err)
		}
	}
	full := func(what, name string) {
		t.Helper()
		if err := testAdd(s, name, store.TierGPU, []uint64{1, 2}); !errors.Is(err, memory.ErrTooManyPods) {
			t.Fatalf("%s: Add for one pod too many: %v, want ErrTooManyPods", what, err)
		}
		if err := s.SetStale(ctx, name, true); !errors.Is(err, memory.ErrTooManyPods) {
			t.Fatalf("%s: SetStale for one pod too many: %v, want ErrTooManyPods", what, err)
		}
		if _, ok, _ := s.AppliedSeq(ctx, name); ok {
			t.Fatalf("%s: the pod refused has a seq", what)
		}
	}
	full("full", "one-too-many")
	if st := s.Stats(); st.Skipped != 2 || st.Blocks != memory.MaxPods {
		t.Fatalf("stats %+v, want 2 skipped and %d blocks", st, memory.MaxPods)
	}
	// A pod whose last block is removed is still known, by its seq.
	if n, err := testRemove(s, pod(7), store.TierGPU, []uint64{7}); n != 1 || err != nil {
		t.Fatalf("Remove = %d, %v", n, err)
	}
	full("a pod emptied", "one-too-many")
	// A forgotten pod makes room.
	if err := s.ForgetPod(ctx, pod(9)); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "one-too-many", store.TierGPU, []uint64{1, 2}); err != nil {
		t.Fatalf("Add after ForgetPod: %v", err)
	}
	// A pod known by its stale mark alone takes room until it is lifted.
	if err := s.ForgetPod(ctx, pod(10)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetStale(ctx, "marked", true); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "another", store.TierGPU, []uint64{3}); !errors.Is(err, memory.ErrTooManyPods) {
		t.Fatalf("Add with a pod known by its mark: %v, want ErrTooManyPods", err)
	}
	if err := s.SetStale(ctx, "marked", false); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "another", store.TierGPU, []uint64{3}); err != nil {
		t.Fatalf("Add after the mark was lifted: %v", err)
	}
	// A new pod whose first batch fails before it changes anything is
	// not kept.
	if err := s.ForgetPod(ctx, pod(11)); err != nil {
		t.Fatal(err)
	}
	cctx := &cancelAfter{Context: ctx, after: 1}
	b := &store.Batch{Seq: 1, Ops: []store.Op{{Kind: store.OpRemove, Keys: []uint64{5}}, {Kind: store.OpAdd, Keys: []uint64{5}}}}
	if _, err := s.Apply(cctx, "flaky", b); !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply canceled between ops: %v", err)
	}
	if p := podInfo(t, s, "flaky"); p != (store.PodInfo{}) {
		t.Fatalf("Pods lists the pod whose first batch failed: %+v", p)
	}
	if err := testAdd(s, "yet-another", store.TierGPU, []uint64{4}); err != nil {
		t.Fatalf("Add after a failed first batch: %v", err)
	}
	full("full again", "one-more")
	got := lookupOne(t, s, []uint64{1, 2}, nil)
	want := map[string]int{"one-too-many": 2, pod(1): 1}
	if !maps.Equal(got, want) {
		t.Fatalf("Lookup = %v, want %v", got, want)
	}
	if st := s.Stats(); st.Pods != memory.MaxPods {
		t.Fatalf("stats %+v, want %d pods", st, memory.MaxPods)
	}
}

// cancelAfter is a context that reports context.Canceled from its
// (after+1)th Err on.
type cancelAfter struct {
	context.Context
	after, calls int
}

func (c *cancelAfter) Err() error {
	if c.calls++; c.calls > c.after {
		return context.Canceled
	}
	return nil
}

// TestPodChurn adds many more pods than there are ids, forgetting most of
// them: their ids are reused.
func TestPodChurn(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memory.Options{CapacityBlocks: 1 << 12})
	kept := 0
	for i := range 3 * memory.MaxPods {
		pod := fmt.Sprintf("pod-%d", i)
		if err := testAdd(s, pod, store.TierGPU, []uint64{uint64(i), uint64(i + 1)}); err != nil {
			t.Fatalf("Add %s: %v", pod, err)
		}
		if i%4 != 0 {
			if err := s.ForgetPod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			continue
		}
		kept++
	}
	ps, err := s.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Blocks > 1<<12 || st.Pods != kept || len(ps) != kept {
		t.Fatalf("stats %+v, %d pods listed; want %d pods", st, len(ps), kept)
	}
}

func lookupOne(t *testing.T, s *memory.Store, keys []uint64, pods []string) map[string]int {
	t.Helper()
	out, err := s.Lookup(context.Background(), keys, pods, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, mt := range out {
		m[mt.Pod] = mt.Blocks
	}
	return m
}

// TestCapacitySkips fills a store of one block: a key's own holders cannot
// be evicted to make room for another holder of it.
func TestCapacitySkips(t *testing.T) {
	s := newStore(t, memory.Options{CapacityBlocks: 1})
	if err := testAdd(s, "a", store.TierGPU, []uint64{5}); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "b", store.TierGPU, []uint64{5}); err != nil {
		t.Fatal(err)
	}
	if got := lookupOne(t, s, []uint64{5}, nil); !maps.Equal(got, map[string]int{"a": 1}) {
		t.Fatalf("Lookup = %v", got)
	}
	if err := testAdd(s, "b", store.TierGPU, []uint64{6}); err != nil {
		t.Fatal(err)
	}
	if got := lookupOne(t, s, []uint64{6}, nil); !maps.Equal(got, map[string]int{"b": 1}) {
		t.Fatalf("Lookup = %v", got)
	}
	if st := s.Stats(); st.Skipped != 1 || st.Evicted != 1 || st.Blocks != 1 {
		t.Fatalf("stats %+v, want 1 skipped, 1 evicted, 1 block", st)
	}
}

// TestEvictionKeepsMatchedBlocks checks the order a pod's holdings are
// evicted in: blocks that lookups keep matching survive a flood of new
// blocks; blocks nobody looks up go. The flood comes from the pod itself,
// which evicts its own, or from another pod, which evicts its own once it
// has its fair share, half, and the first pod's beyond its half until then.
func TestEvictionKeepsMatchedBlocks(t *testing.T) {
	for _, flooder := range []string{"a", "b"} {
		t.Run(flooder, func(t *testing.T) {
			ctx := context.Background()
			const capacity = 1 << 13
			s := newStore(t, memory.Options{CapacityBlocks: capacity})
			hot := storetest.Keys(1, capacity/8)
			cold := storetest.Keys(2, capacity/2)
			for _, ks := range [][]uint64{hot, cold} {
				if err := testAdd(s, "a", store.TierGPU, ks); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 64 {
				if _, err := s.Lookup(ctx, hot, nil, nil); err != nil {
					t.Fatal(err)
				}
				if err := testAdd(s, flooder, store.TierGPU, storetest.Keys(uint64(100+i), capacity/32)); err != nil {
					t.Fatal(err)
				}
			}
			held := func(keys []uint64) int {
				n := 0
				for _, k := range keys {
					n += len(lookupOne(t, s, []uint64{k}, []string{"a"}))
				}
				return n
			}
			st := s.Stats()
			h, c := held(hot), held(cold)
			t.Logf("after adding %d blocks to a store of %d: %d of %d hot and %d of %d cold blocks left; %+v", 2*capacity, capacity, h, len(hot), c, len(cold), st)
			if st.Evicted < int64(capacity/2) || st.Blocks > capacity {
				t.Fatalf("stats %+v: want at least %d evicted, at most %d held", st, capacity/2, capacity)
			}
			if h < len(hot)*95/100 {
				t.Fatalf("%d of %d hot blocks left; want nearly all", h, len(hot))
			}
			if flooder == "a" && c > len(cold)/10 {
				t.Fatalf("%d of %d cold blocks left; want few", c, len(cold))
			}
			if flooder == "b" {
				// a is cut to its half, from its cold blocks; b holds the rest.
				if a := h + c; a < capacity/2-capacity/32 || a > capacity/2+capacity/32 {
					t.Fatalf("a holds %d blocks, want about %d", a, capacity/2)
				}
			}
		})
	}
}

// gather returns reg's metrics by name and label values.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = v
		}
	}
	return got
}

// podInfo returns pod's entry in s.Pods.
func podInfo(t *testing.T, s *memory.Store, pod string) store.PodInfo {
	t.Helper()
	ps, err := s.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Name == pod {
			return p
		}
	}
	return store.PodInfo{}
}

// fillHalves fills a store of capacity c with a then b, half each, in
// prompts of 64 blocks, and returns their prompts. Some shards hold more
// than their share of the keys and fill before the store does.
func fillHalves(t *testing.T, s *memory.Store, c int, seed uint64) (a, b [][]uint64) {
	t.Helper()
	for i := range c / 2 / 64 {
		a = append(a, storetest.Keys(seed+uint64(i), 64))
		if err := testAdd(s, "a", store.TierGPU, a[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c / 2 / 64 {
		b = append(b, storetest.Keys(seed+1000+uint64(i), 64))
		if err := testAdd(s, "b", store.TierGPU, b[i]); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// whole reports whether pod holds every prompt whole, with complete
// matches.
func whole(t *testing.T, s *memory.Store, pod string, prompts [][]uint64) bool {
	t.Helper()
	for _, p := range prompts {
		out, err := s.Lookup(context.Background(), p, []string{pod}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || out[0].Blocks != len(p) || out[0].Incomplete {
			return false
		}
	}
	return true
}

// TestSetCacheBlocks fills a store with two pods, half each, so that some
// shards overflow: with a cache size set for the first, smaller than what
// it holds, it loses its own blocks and the second, within its fair share,
// keeps all of its; without one, nobody is over and the second, adding,
// loses its own. The size is kept before the pod holds anything and after
// it is cleared.
func TestSetCacheBlocks(t *testing.T) {
	const c = 1 << 12
	for _, tc := range []struct {
		name  string
		sizes []int // set for a before it is first filled, in order
		over  bool  // whether a is over its cache size
	}{
		{"set", []int{c / 8}, true},
		{"none", nil, false},
		{"cleared", []int{c / 8, 0}, false},
		{"large", []int{c}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := prometheus.NewRegistry()
			s := newStore(t, memory.Options{CapacityBlocks: c, Registerer: reg})
			for _, n := range tc.sizes {
				s.SetCacheBlocks("a", n)
			}
			for round := range 2 {
				base := gather(t, reg)
				a, b := fillHalves(t, s, c, uint64(round)<<16)
				got := gather(t, reg)
				for _, why := range []string{"over_cache_size", "over_fair_share", "own"} {
					got["prefixd_store_evicted_blocks_total/"+why] -= base["prefixd_store_evicted_blocks_total/"+why]
				}
				pa, pb := podInfo(t, s, "a"), podInfo(t, s, "b")
				t.Logf("round %d: %+v %+v; evictions %v over cache size, %v over fair share, %v own", round, pa, pb,
					got["prefixd_store_evicted_blocks_total/over_cache_size"], got["prefixd_store_evicted_blocks_total/over_fair_share"], got["prefixd_store_evicted_blocks_total/own"])
				if pa.Evicted+pb.Evicted == 0 {
					t.Fatalf("nothing evicted: %+v %+v", pa, pb)
				}
				if tc.over {
					if !whole(t, s, "b", b) || pb.Evicted != 0 || pa.Evicted == 0 || got["prefixd_store_evicted_blocks_total/own"] != 0 {
						t.Fatalf("a over its cache size: b %+v, whole %v; a %+v; want b whole and a's blocks evicted", pb, whole(t, s, "b", b), pa)
					}
					if got["prefixd_store_pod_evicted_blocks/a"] != float64(pa.Evicted) || got["prefixd_store_pod_evicted_blocks/b"] != 0 {
						t.Fatalf("per-pod evictions %v, want a's %d only", got, pa.Evicted)
					}
				} else {
					if !whole(t, s, "a", a) || pa.Evicted != 0 || pb.Evicted == 0 || got["prefixd_store_evicted_blocks_total/over_cache_size"] != 0 {
						t.Fatalf("nobody over: a %+v, whole %v; b %+v; want a whole and b's own blocks evicted", pa, whole(t, s, "a", a), pb)
					}
				}
				if err := s.ForgetPod(ctx, "a"); err != nil {
					t.Fatal(err)
				}
				if err := s.ForgetPod(ctx, "b"); err != nil {
					t.Fatal(err)
				}
				if st := s.Stats(); st.Blocks != 0 {
					t.Fatalf("stats %+v after clearing both pods", st)
				}
				for _, n := range []string{"a", "b"} {
					if p := podInfo(t, s, n); p != (store.PodInfo{}) {
						t.Fatalf("Pods after ForgetPod(%s) lists %+v", n, p)
					}
				}
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s := newStore(t, memory.Options{CapacityBlocks: 1 << 10, Registerer: reg})
	for i := range 40 {
		if err := testAdd(s, fmt.Sprintf("p%d", i%3), store.TierGPU, storetest.Keys(uint64(i), 64)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Evicted == 0 {
		t.Fatalf("stats %+v: want evictions", st)
	}
	got := gather(t, reg)
	want := map[string]float64{
		"prefixd_store_dropped_blocks_total/capacity": 0,
		"prefixd_store_blocks":                        float64(st.Blocks),
		"prefixd_store_keys":                          float64(st.Keys),
		"prefixd_store_pods":                          3,
		"prefixd_store_capacity_blocks":               1 << 10,
		"prefixd_store_engine_pairs":                  0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], v, got)
		}
	}
	evicted := 0.0
	for _, why := range []string{"over_cache_size", "over_fair_share", "own"} {
		v, ok := got["prefixd_store_evicted_blocks_total/"+why]
		if !ok {
			t.Errorf("no prefixd_store_evicted_blocks_total{reason=%q} (all: %v)", why, got)
		}
		evicted += v
	}
	if evicted != float64(st.Evicted) {
		t.Errorf("prefixd_store_evicted_blocks_total sums to %v, want %d (all: %v)", evicted, st.Evicted, got)
	}
	ps, err := s.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if got["prefixd_store_pod_evicted_blocks/"+p.Name] != float64(p.Evicted) || p.Evicted == 0 {
			t.Errorf("prefixd_store_pod_evicted_blocks{pod=%q} = %v, Pods says %+v", p.Name, got["prefixd_store_pod_evicted_blocks/"+p.Name], p)
		}
	}
	// Only pods with evictions have the series.
	if err := s.ForgetPod(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "p1", store.TierGPU, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if _, ok := gather(t, reg)["prefixd_store_pod_evicted_blocks/p1"]; ok {
		t.Errorf("prefixd_store_pod_evicted_blocks{pod=p1} reported after ForgetPod")
	}
	if got["prefixd_store_bytes"] <= 0 {
		t.Errorf("prefixd_store_bytes = %v", got["prefixd_store_bytes"])
	}
	// A second store cannot register the same metrics.
	_, err = memory.New(memory.Options{Registerer: reg})
	if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
		t.Fatalf("second New on one registry: %v, want AlreadyRegisteredError", err)
	}
}

// TestLearnedCacheSize has a pod remove blocks from its GPU tier, as an
// engine does when its cache is full, and then hold more than it held
// then: it is over the cache size it taught the store and loses its own
// blocks first when a shard overflows. Removals from other tiers teach
// nothing.
func TestLearnedCacheSize(t *testing.T) {
	const c = 1 << 12
	for _, tc := range []struct {
		tier store.Tier
		over bool
	}{{store.TierGPU, true}, {store.TierCPU, false}} {
		t.Run(tc.tier.String(), func(t *testing.T) {
			s := newStore(t, memory.Options{CapacityBlocks: c})
			var a [][]uint64
			addA := func(n int) {
				for range n / 64 {
					a = append(a, storetest.Keys(uint64(len(a)), 64))
					if err := testAdd(s, "a", store.TierGPU, a[len(a)-1]); err != nil {
						t.Fatal(err)
					}
				}
			}
			addA(c / 4)
			// The last prompt's blocks move to the CPU tier.
			gone := a[len(a)-1]
			if err := testAdd(s, "a", store.TierCPU, gone); err != nil {
				t.Fatal(err)
			}
			if n, err := testRemove(s, "a", tc.tier, gone); err != nil || n != len(gone) {
				t.Fatalf("Remove = %d, %v", n, err)
			}
			addA(c / 4)
			var b [][]uint64
			for i := range c / 2 / 64 {
				b = append(b, storetest.Keys(uint64(1000+i), 64))
				if err := testAdd(s, "b", store.TierGPU, b[i]); err != nil {
					t.Fatal(err)
				}
			}
			pa, pb := podInfo(t, s, "a"), podInfo(t, s, "b")
			t.Logf("%+v %+v", pa, pb)
			if pa.Evicted+pb.Evicted == 0 {
				t.Fatalf("nothing evicted: %+v %+v", pa, pb)
			}
			if tc.over && (!whole(t, s, "b", b) || pa.Evicted == 0) {
				t.Fatalf("a over the cache size it showed: a %+v, b %+v; want b whole and a's blocks evicted", pa, pb)
			}
			if !tc.over && (!whole(t, s, "a", a) || pb.Evicted == 0) {
				t.Fatalf("no cache size learned: a %+v, b %+v; want a whole and b's own blocks evicted", pa, pb)
			}
		})
	}
}

// TestEvictionSparesAddedKey adds a new holder of a key to a full shard
// whose other pod is over its share and holds that key first in line: the
// key stays, for both pods, and another of the other pod's goes.
func TestEvictionSparesAddedKey(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memory.Options{Shards: 1, CapacityBlocks: 4})
	keys := []uint64{11, 12, 13, 14}
	if err := testAdd(s, "a", store.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "b", store.TierGPU, keys[:1]); err != nil {
		t.Fatal(err)
	}
	if got := lookupOne(t, s, keys[:1], nil); !maps.Equal(got, map[string]int{"a": 1, "b": 1}) {
		t.Fatalf("Lookup of the key added = %v, want both pods", got)
	}
	left := 0
	for _, k := range keys[1:] {
		left += len(lookupOne(t, s, []uint64{k}, nil))
	}
	if st := s.Stats(); left != 2 || st.Blocks != 4 || st.Evicted != 1 {
		t.Fatalf("%d of a's other 3 keys left, stats %+v; want 2, 4 blocks, 1 evicted", left, st)
	}
	out, err := s.Lookup(ctx, keys[:1], nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range out {
		if m.Incomplete != (m.Pod == "a") {
			t.Fatalf("Lookup = %+v, want only a's match Incomplete", out)
		}
	}
	if p := podInfo(t, s, "a"); p.Evicted != 1 || p.Blocks != 3 {
		t.Fatalf("Pods: %+v, want a with 3 blocks, 1 evicted", p)
	}
}

// TestFloodSparesOthers is the flood at full scale: ten pods hold 150k
// blocks of a store of 200k, then one pod sends 100k. The ten are within
// their share (200k/11 each) and keep every block, complete; the flooding
// pod pays for the overflow with its own blocks.
func TestFloodSparesOthers(t *testing.T) {
	const capacity, pods, per, flood = 200_000, 10, 15_000, 100_000
	s := newStore(t, memory.Options{CapacityBlocks: capacity})
	prompts := make([][][]uint64, pods)
	for p := range pods {
		for i := range per / 500 {
			keys := storetest.Keys(uint64(p<<16+i), 500)
			prompts[p] = append(prompts[p], keys)
			if err := testAdd(s, fmt.Sprintf("pod-%d", p), store.TierGPU, keys); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range flood / 500 {
		if err := testAdd(s, "flood", store.TierGPU, storetest.Keys(uint64(1<<24+i), 500)); err != nil {
			t.Fatal(err)
		}
	}
	for p := range pods {
		if name := fmt.Sprintf("pod-%d", p); !whole(t, s, name, prompts[p]) {
			t.Fatalf("%s lost blocks to the flood: %+v", name, podInfo(t, s, name))
		}
	}
	st, f := s.Stats(), podInfo(t, s, "flood")
	t.Logf("%+v; %+v", st, f)
	if st.Blocks > capacity || f.Evicted == 0 || f.Blocks+f.Evicted != flood {
		t.Fatalf("stats %+v, flooding pod %+v: want at most %d blocks, and the flood's evicted and held making %d", st, f, capacity, flood)
	}
}
