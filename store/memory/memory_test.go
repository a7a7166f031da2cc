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

func TestTooManyPods(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memory.Options{})
	pod := func(i int) string { return fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256) }
	for i := range memory.MaxPods {
		if err := s.Add(ctx, pod(i), store.TierGPU, []uint64{uint64(i)}); err != nil {
			t.Fatalf("Add for pod %d: %v", i, err)
		}
	}
	err := s.Add(ctx, "one-too-many", store.TierGPU, []uint64{1, 2})
	if !errors.Is(err, memory.ErrTooManyPods) {
		t.Fatalf("Add for pod %d: %v, want ErrTooManyPods", memory.MaxPods, err)
	}
	if st := s.Stats(); st.Skipped != 2 || st.Blocks != memory.MaxPods {
		t.Fatalf("stats %+v, want 2 skipped and %d blocks", st, memory.MaxPods)
	}
	// A pod whose last block is removed gives its id back when one is needed.
	if n, err := s.Remove(ctx, pod(7), store.TierGPU, []uint64{7}); n != 1 || err != nil {
		t.Fatalf("Remove = %d, %v", n, err)
	}
	if err := s.Add(ctx, "one-too-many", store.TierGPU, []uint64{1, 2}); err != nil {
		t.Fatalf("Add after a pod emptied: %v", err)
	}
	// So does a cleared pod.
	if err := s.ClearPod(ctx, pod(9)); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, "another", store.TierGPU, []uint64{3}); err != nil {
		t.Fatalf("Add after ClearPod: %v", err)
	}
	got := lookupOne(t, s, []uint64{1, 2}, nil)
	want := map[string]int{"one-too-many": 2, pod(1): 1}
	if !maps.Equal(got, want) {
		t.Fatalf("Lookup = %v, want %v", got, want)
	}
	if err := s.ClearPod(ctx, pod(7)); err != nil {
		t.Fatal(err)
	}
}

// TestPodChurn clears and adds many more pods than there are ids.
func TestPodChurn(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memory.Options{CapacityBlocks: 1 << 12})
	for i := range 3 * memory.MaxPods {
		pod := fmt.Sprintf("pod-%d", i)
		if err := s.Add(ctx, pod, store.TierGPU, []uint64{uint64(i), uint64(i + 1)}); err != nil {
			t.Fatalf("Add %s: %v", pod, err)
		}
		if i%3 != 0 {
			if err := s.ClearPod(ctx, pod); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := s.Stats(); st.Blocks > 1<<12 || st.Pods > memory.MaxPods {
		t.Fatalf("stats %+v", st)
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
	ctx := context.Background()
	s := newStore(t, memory.Options{CapacityBlocks: 1})
	if err := s.Add(ctx, "a", store.TierGPU, []uint64{5}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, "b", store.TierGPU, []uint64{5}); err != nil {
		t.Fatal(err)
	}
	if got := lookupOne(t, s, []uint64{5}, nil); !maps.Equal(got, map[string]int{"a": 1}) {
		t.Fatalf("Lookup = %v", got)
	}
	if err := s.Add(ctx, "b", store.TierGPU, []uint64{6}); err != nil {
		t.Fatal(err)
	}
	if got := lookupOne(t, s, []uint64{6}, nil); !maps.Equal(got, map[string]int{"b": 1}) {
		t.Fatalf("Lookup = %v", got)
	}
	if st := s.Stats(); st.Skipped != 1 || st.Evicted != 1 || st.Blocks != 1 {
		t.Fatalf("stats %+v, want 1 skipped, 1 evicted, 1 block", st)
	}
}

// TestClockKeepsMatchedBlocks checks the eviction policy: blocks that
// lookups keep matching survive a flood of new blocks; blocks nobody looks
// up go.
func TestClockKeepsMatchedBlocks(t *testing.T) {
	ctx := context.Background()
	const capacity = 1 << 13
	s := newStore(t, memory.Options{CapacityBlocks: capacity})
	hot := storetest.Keys(1, capacity/8)
	cold := storetest.Keys(2, capacity/2)
	for _, ks := range [][]uint64{hot, cold} {
		if err := s.Add(ctx, "a", store.TierGPU, ks); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 64 {
		if _, err := s.Lookup(ctx, hot, nil, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Add(ctx, "b", store.TierGPU, storetest.Keys(uint64(100+i), capacity/32)); err != nil {
			t.Fatal(err)
		}
	}
	held := func(keys []uint64) int {
		n := 0
		for _, k := range keys {
			n += len(lookupOne(t, s, []uint64{k}, nil))
		}
		return n
	}
	st := s.Stats()
	h, c := held(hot), held(cold)
	t.Logf("after adding %d blocks to a store of %d: %d of %d hot and %d of %d cold blocks left; %+v", 2*capacity, capacity, h, len(hot), c, len(cold), st)
	if st.Evicted < int64(capacity) || st.Blocks > capacity {
		t.Fatalf("stats %+v: want at least %d evicted, at most %d held", st, capacity, capacity)
	}
	if h < len(hot)*95/100 || c > len(cold)/10 {
		t.Fatalf("%d of %d hot and %d of %d cold blocks left; want nearly all hot and few cold", h, len(hot), c, len(cold))
	}
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s := newStore(t, memory.Options{CapacityBlocks: 1 << 10, Registerer: reg})
	for i := range 40 {
		if err := s.Add(ctx, fmt.Sprintf("p%d", i%3), store.TierGPU, storetest.Keys(uint64(i), 64)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Evicted == 0 {
		t.Fatalf("stats %+v: want evictions", st)
	}
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
	want := map[string]float64{
		"prefixd_store_evicted_blocks_total":          float64(st.Evicted),
		"prefixd_store_dropped_blocks_total/capacity": 0,
		"prefixd_store_blocks":                        float64(st.Blocks),
		"prefixd_store_keys":                          float64(st.Keys),
		"prefixd_store_pods":                          3,
		"prefixd_store_capacity_blocks":               1 << 10,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], v, got)
		}
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
