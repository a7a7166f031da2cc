package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prefixd/prefixd/store"
)

// TestEngineMapBounded has a pod store pairs far beyond the store's
// capacity and never remove a block, as a pod whose holdings are evicted
// for capacity does: its engine-hash map must stay within a few times its
// blocks, and what it resolves must be what the pod holds.
func TestEngineMapBounded(t *testing.T) {
	ctx := context.Background()
	const capacity = 1 << 12
	s, err := New(Options{CapacityBlocks: capacity})
	if err != nil {
		t.Fatal(err)
	}
	keys, hashes := make([]uint64, 64), make([]uint64, 64)
	for round := range 20 * capacity / len(keys) {
		for i := range keys {
			n := uint64(round*len(keys) + i)
			keys[i], hashes[i] = n*0x9e3779b97f4a7c15, ^n
		}
		op := store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys, Engine: hashes}
		if round%2 == 1 {
			// Another pod takes room too, so the first loses blocks to
			// the fair share as well as to its own adds.
			if _, err := applyOps(s, "other", store.Op{Kind: store.OpAdd, Keys: slices.Clone(keys[:8])}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := applyOps(s, "a", op); err != nil {
			t.Fatal(err)
		}
		st := s.states[s.ids["a"]]
		held := int(s.pods.held[st.id].Load())
		if n := len(st.engine); n > max(2*held+engineSlack, st.sweepFloor) {
			t.Fatalf("round %d: %d pairs for %d blocks (next sweep at %d)", round, n, held, st.sweepFloor)
		}
		if n := len(st.engine); n > 3*capacity+engineSlack {
			t.Fatalf("round %d: %d pairs, for a store of %d blocks", round, n, capacity)
		}
	}
	st := s.Stats()
	t.Logf("%+v; next sweep at %d pairs", st, s.states[s.ids["a"]].sweepFloor)
	if st.Evicted == 0 || st.EnginePairs == 0 || st.EnginePairs > 3*capacity+engineSlack {
		t.Fatalf("stats %+v: want evictions and at most %d pairs", st, 3*capacity+engineSlack)
	}
	// Every pair resolves to a block the pod holds, and those it holds
	// resolve.
	ps := s.states[s.ids["a"]]
	all := make([]uint64, 0, len(ps.engine))
	for h := range ps.engine {
		all = append(all, h)
	}
	ks, found, err := s.EngineKeys(ctx, "a", all, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	resolved := 0
	for i, h := range all {
		if found[i] {
			resolved++
			if ks[i] != (^h)*0x9e3779b97f4a7c15 || len(lookupNames(t, s, ks[i:i+1], "a")) != 1 {
				t.Fatalf("hash %#x resolved to %#x, which the pod does not hold", h, ks[i])
			}
		}
	}
	if held := int(s.pods.held[ps.id].Load()); resolved != held {
		t.Fatalf("%d pairs resolve, the pod holds %d blocks", resolved, held)
	}
	checkInvariants(t, s)
}

func lookupNames(t *testing.T, s *Store, keys []uint64, pods ...string) []string {
	t.Helper()
	out, err := s.Lookup(context.Background(), keys, pods, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range out {
		names = append(names, m.Pod)
	}
	return names
}

// TestApplySerializesPod races goroutines applying batches of one pod at
// seqs handed out in order but arriving in any: each seq applies at most
// once, a batch applies only above the seq before it, and the pod ends
// holding the key of every batch that applied and at the highest seq.
func TestApplySerializesPod(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, per = 4, 200
	var (
		next    atomic.Uint64
		mu      sync.Mutex
		applied []uint64
		wg      sync.WaitGroup
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				seq := next.Add(1)
				res, err := s.Apply(ctx, "p", &store.Batch{Seq: seq, Ops: []store.Op{
					{Kind: store.OpAdd, Keys: []uint64{seq}},
					{Kind: store.OpAdd, Tier: store.TierCPU, Keys: []uint64{seq}},
				}})
				switch {
				case err != nil:
					t.Error(err)
					return
				case res.Duplicate && res.AppliedSeq < seq:
					t.Errorf("seq %d a duplicate of applied seq %d", seq, res.AppliedSeq)
				case !res.Duplicate:
					if res.AppliedSeq != seq {
						t.Errorf("seq %d applied as %d", seq, res.AppliedSeq)
					}
					mu.Lock()
					applied = append(applied, seq)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(applied)
	if len(applied) == 0 {
		t.Fatal("nothing applied")
	}
	for i := 1; i < len(applied); i++ {
		if applied[i] == applied[i-1] {
			t.Fatalf("seq %d applied twice", applied[i])
		}
	}
	seq, ok, err := s.AppliedSeq(ctx, "p")
	if err != nil || !ok || seq != applied[len(applied)-1] {
		t.Fatalf("AppliedSeq = %d, %v, %v; want %d", seq, ok, err, applied[len(applied)-1])
	}
	for k := uint64(1); k <= goroutines*per; k++ {
		_, want := slices.BinarySearch(applied, k)
		if got := len(lookupNames(t, s, []uint64{k})) == 1; got != want {
			t.Fatalf("key %d held %v, its batch applied %v", k, got, want)
		}
	}
	checkInvariants(t, s)
}

// TestPodLockIsThePods holds one pod's lock, as a long Apply does, and
// uses the store meanwhile from the same goroutine: everything but that
// pod's own writes goes on (anything that waited would hang the test).
func TestPodLockIsThePods(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := applyOps(s, "a", store.Op{Kind: store.OpAdd, Keys: []uint64{1, 2}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.lockState("a", false)
	if err != nil || st == nil {
		t.Fatalf("lockState = %v, %v", st, err)
	}
	defer st.mu.Unlock()
	for _, pod := range []string{"b", "c"} {
		if _, err := applyOps(s, pod, store.Op{Kind: store.OpAdd, Keys: []uint64{1, 3}}, store.Op{Kind: store.OpClear}, store.Op{Kind: store.OpAdd, Keys: []uint64{1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetStale(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetPod(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.EngineKeys(ctx, "b", []uint64{1}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if seq, ok, err := s.AppliedSeq(ctx, "a"); err != nil || !ok || seq != 0 {
		t.Fatalf("AppliedSeq(a) = %d, %v, %v", seq, ok, err)
	}
	if got := lookupNames(t, s, []uint64{1, 2}); len(got) != 2 {
		t.Fatalf("Lookup = %v, want a and b", got)
	}
	if ps, err := s.Pods(ctx); err != nil || len(ps) != 2 {
		t.Fatalf("Pods = %+v, %v", ps, err)
	}
	if _, err := s.DecideKeyMode(ctx, "m", store.KeyModeTokens); err != nil {
		t.Fatal(err)
	}
	_ = s.Stats()
}

// TestAllocs checks that the calls on the hot paths allocate nothing when
// the caller's slices have room: Lookup, EngineKeys, and Apply of adds and
// removes by key or engine hash that need no new room.
func TestAllocs(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, hashes := make([]uint64, 64), make([]uint64, 64)
	for i := range keys {
		keys[i], hashes[i] = uint64(i+1)*0x9e3779b97f4a7c15, uint64(i)
	}
	if _, err := applyOps(s, "a", store.Op{Kind: store.OpAdd, Keys: keys, Engine: hashes}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetStale(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	out := make([]store.Match, 0, 4)
	ks, found := make([]uint64, 0, len(hashes)), make([]bool, 0, len(hashes))
	seq := uint64(1)
	b := &store.Batch{Ops: make([]store.Op, 2)}
	for name, f := range map[string]func(){
		"Lookup": func() {
			out, _ = s.Lookup(ctx, keys, nil, out)
			if len(out) != 1 || !out[0].Stale || out[0].Blocks != len(keys) {
				t.Fatalf("Lookup = %+v", out)
			}
		},
		"EngineKeys": func() {
			ks, found, _ = s.EngineKeys(ctx, "a", hashes, ks, found)
			if !found[len(found)-1] {
				t.Fatalf("EngineKeys = %v", found)
			}
		},
		"Apply by key": func() {
			seq++
			b.Seq = seq
			b.Ops[0] = store.Op{Kind: store.OpAdd, Tier: store.TierCPU, Keys: keys[:8]}
			b.Ops[1] = store.Op{Kind: store.OpRemove, Tier: store.TierCPU, Keys: keys[:8]}
			if res, err := s.Apply(ctx, "a", b); err != nil || res.Removed != 8 {
				t.Fatalf("Apply = %+v, %v", res, err)
			}
		},
		"Apply by engine hash": func() {
			seq++
			b.Seq = seq
			b.Ops[0] = store.Op{Kind: store.OpAdd, Tier: store.TierDisk, Engine: hashes[8:16]}
			b.Ops[1] = store.Op{Kind: store.OpRemove, Tier: store.TierDisk, Engine: hashes[8:16]}
			if res, err := s.Apply(ctx, "a", b); err != nil || res.Removed != 8 || res.Unknown != 0 {
				t.Fatalf("Apply = %+v, %v", res, err)
			}
		},
	} {
		f() // warm the pools and the pod's lists
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations a call, want 0", name, n)
		}
	}
}

// TestModelLimits fills the model state to its limits: beyond them new
// models and adapters are refused, and known ones still answer.
func TestModelLimits(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxModels {
		if _, err := s.DecideKeyMode(ctx, fmt.Sprintf("m%d", i), store.KeyModeEngine); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DecideKeyMode(ctx, "one-too-many", store.KeyModeEngine); !errors.Is(err, ErrTooManyModels) {
		t.Fatalf("DecideKeyMode beyond MaxModels: %v", err)
	}
	if _, err := s.AddLoRA(ctx, "l", "one-too-many"); !errors.Is(err, ErrTooManyModels) {
		t.Fatalf("AddLoRA of a new base beyond MaxModels: %v", err)
	}
	if mode, err := s.DecideKeyMode(ctx, "m7", store.KeyModeTokens); err != nil || mode != store.KeyModeEngine {
		t.Fatalf("DecideKeyMode of a known model = %q, %v", mode, err)
	}
	for i := range MaxLoRAs {
		if _, err := s.AddLoRA(ctx, fmt.Sprintf("l%d", i), fmt.Sprintf("m%d", i%MaxModels)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AddLoRA(ctx, "one-too-many", "m0"); !errors.Is(err, ErrTooManyLoRAs) {
		t.Fatalf("AddLoRA beyond MaxLoRAs: %v", err)
	}
	if base, err := s.AddLoRA(ctx, "l5", "m0"); err != nil || base != "m5" {
		t.Fatalf("AddLoRA of a known adapter = %q, %v", base, err)
	}
	models, err := s.Models(ctx)
	if err != nil || len(models) != MaxModels || len(models["m3"].LoRAs) != MaxLoRAs/MaxModels {
		t.Fatalf("Models: %d models, m3 %+v, %v", len(models), models["m3"], err)
	}
}
