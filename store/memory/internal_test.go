package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prefixd/prefixd/store"
)

// TestTableAlignment checks what the layout relies on for speed: a home
// line is one cache line.
func TestTableAlignment(t *testing.T) {
	var keep []*table
	for n := uint64(minLines); n < 5000; n = n*growNum/growDen + 1 {
		tb := newTable(n, 8)
		keep = append(keep, tb) // so that tables do not reuse each other's memory
		if p := uintptr(unsafe.Pointer(&tb.s[0])); p%64 != 0 {
			t.Errorf("table of %d lines at %#x, not 64-byte aligned", n, p)
		}
	}
	if unsafe.Sizeof(paddedShard{})&(unsafe.Sizeof(paddedShard{})-1) != 0 {
		t.Errorf("a padded shard is %d bytes, not a power of two", unsafe.Sizeof(paddedShard{}))
	}
	_ = keep
}

// TestLookupWaitsForWriter holds a shard as a writer would, so that a
// lookup of one of its keys gives up reading optimistically and waits for
// the lock; it must still answer right.
func TestLookupWaitsForWriter(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{11, 12, 13}
	if err := testAdd(s, "a", store.TierCPU, keys); err != nil {
		t.Fatal(err)
	}
	sh := s.shard(mix(keys[1]))
	sh.lock()
	var wg sync.WaitGroup
	var out []store.Match
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, err = s.Lookup(ctx, keys, nil, nil)
	}()
	time.Sleep(20 * time.Millisecond) // let the lookup reach the shard (correct either way)
	sh.unlock()
	wg.Wait()
	if err != nil || len(out) != 1 || out[0].Blocks != 3 || out[0].TierBlocks[store.TierCPU] != 3 {
		t.Fatalf("Lookup = %+v, %v", out, err)
	}
}

// TestLookupAges checks that a lookup sets the age of the blocks it
// matches, and only those.
func TestLookupAges(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{21, 22, 23, 24, 25}
	if err := testAdd(s, "a", store.TierGPU, keys[:3]); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "b", store.TierGPU, keys[3:]); err != nil {
		t.Fatal(err)
	}
	age := func(k uint64) uint64 {
		h := mix(k)
		_, r, ok := s.shard(h).tbl.Load().find(&s.arena, h)
		if !ok {
			t.Fatalf("key %d not found", k)
		}
		return r.w & ageMask >> ageShift
	}
	for _, k := range keys {
		if a := age(k); a != 1 {
			t.Fatalf("key %d stored with age %d, want 1", k, a)
		}
	}
	// Not under pressure, lookups write nothing.
	if _, err := s.Lookup(ctx, keys, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if a := age(k); a != 1 {
			t.Fatalf("key %d: age %d after a lookup without pressure, want 1", k, a)
		}
	}
	for i := range s.shards {
		s.shards[i].pressure.Store(true)
	}
	s.pressured.Store(int32(len(s.shards)))
	if _, err := s.Lookup(ctx, keys, nil, nil); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := uint64(1)
		if i < 3 {
			want = 3
		}
		if a := age(k); a != want {
			t.Errorf("key %d: age %d after the lookup, want %d", k, a, want)
		}
	}
}

// TestShrink empties a large store and checks that its tables shrink.
func TestShrink(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, 60000)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	if err := testAdd(s, "a", store.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "b", store.TierDisk, keys[:10]); err != nil {
		t.Fatal(err)
	}
	full := s.Stats().Bytes
	if n, err := testRemove(s, "a", store.TierGPU, keys[:48000]); err != nil || n != 48000 {
		t.Fatalf("Remove = %d, %v", n, err)
	}
	checkInvariants(t, s)
	if err := s.ForgetPod(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, s)
	st := s.Stats()
	if st.Keys != 10 || st.Bytes > full/20 {
		t.Fatalf("stats %+v after emptying a store of %d bytes", st, full)
	}
}

// TestConcurrentStress runs writers that share keys (so blocks move
// between inline holders and sets), fill a small store (so shards evict,
// grow and shrink) and clear pods, against lookups; run it with the race
// detector. The bookkeeping must be whole at the end.
func TestConcurrentStress(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{CapacityBlocks: 1500})
	if err != nil {
		t.Fatal(err)
	}
	universe := make([]uint64, 2000)
	for i := range universe {
		universe[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			for i := range 250 {
				pod := fmt.Sprintf("w%d-%d", w, rng.IntN(8))
				from := rng.IntN(len(universe) - 64)
				keys := universe[from : from+1+rng.IntN(63)]
				hashes := make([]uint64, len(keys))
				for j, k := range keys {
					hashes[j] = ^k
				}
				tier := store.Tier(rng.IntN(3))
				var err error
				switch {
				case i%50 == 49:
					err = s.ForgetPod(ctx, pod)
				case i%50 == 24:
					err = testClear(s, pod)
				case i%10 == 7:
					err = s.SetStale(ctx, pod, rng.IntN(2) == 0)
				case rng.IntN(3) == 0:
					_, err = testRemove(s, pod, tier, keys)
				case rng.IntN(4) == 0:
					// Tokens mode: pairs, then blocks named by hash.
					_, err = applyOps(s, pod,
						store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys, Engine: hashes},
						store.Op{Kind: store.OpAdd, Tier: store.Tier(rng.IntN(3)), Engine: hashes[:len(hashes)/2]},
						store.Op{Kind: store.OpRemove, Tier: store.Tier(rng.IntN(3)), Engine: hashes[len(hashes)/3:]})
				case from > 0 && rng.IntN(2) == 0:
					// Continuing the chain before it, which another writer
					// may be continuing too.
					err = testAddAfter(s, pod, tier, universe[from-1], keys[:1+rng.IntN(len(keys))])
				default:
					err = testAdd(s, pod, tier, keys)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for r := range 3 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 6))
			var out []store.Match
			for {
				select {
				case <-done:
					return
				default:
				}
				from := rng.IntN(len(universe) - 200)
				keys := universe[from : from+200]
				var err error
				if out, err = s.Lookup(ctx, keys, nil, out); err != nil {
					t.Error(err)
					return
				}
				for _, m := range out {
					sum := 0
					for _, n := range m.TierBlocks {
						sum += n
					}
					if m.Blocks < 1 || m.Blocks > len(keys) || sum != m.Blocks || m.Pod == "" {
						t.Errorf("bad match %+v", m)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	rwg.Wait()
	checkInvariants(t, s)
	if st := s.Stats(); st.Blocks > 1500 {
		t.Fatalf("stats %+v over capacity", st)
	}
}

// TestCompactionUnderLookups churns blocks around prompts that stay, so
// that segments go sparse and compaction keeps moving the records of the
// prompts that stay, while lookups ask for those prompts: every lookup must
// find them whole, through moved records and the index. Run it with the
// race detector.
func TestCompactionUnderLookups(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{Shards: 8, CapacityBlocks: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	const promptLen = 64
	key := func(p, j int) uint64 { return uint64(p)<<20 | uint64(j) }
	prompt := func(p int) []uint64 {
		keys := make([]uint64, promptLen)
		for j := range keys {
			keys[j] = key(p, j)
		}
		return keys
	}
	// Prompts 0-9 stay; each is stored between churned ones, in pieces.
	stay := make([][]uint64, 10)
	for p := range stay {
		stay[p] = prompt(p)
		for i := 0; i < promptLen; i += 16 {
			if err := testAdd(s, "keep", store.TierGPU, stay[p][i:i+16]); err != nil {
				t.Fatal(err)
			}
			if err := testAdd(s, "churn", store.TierGPU, prompt(1000+p*4+i/16)); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []store.Match
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				q := stay[(i+r)%len(stay)]
				var err error
				if out, err = s.Lookup(ctx, q, nil, out); err != nil {
					t.Error(err)
					return
				}
				if len(out) != 1 || out[0].Pod != "keep" || out[0].Blocks != promptLen {
					t.Errorf("lookup of a prompt that stays = %+v", out)
					return
				}
			}
		}()
	}
	where := func(k uint64) *rec {
		h := mix(k)
		_, r, ok := s.shard(h).tbl.Load().find(&s.arena, h)
		if !ok {
			t.Fatalf("key %#x not found", k)
		}
		return r
	}
	first := where(stay[0][0])
	for round := range 300 {
		p := 2000 + round
		if err := testAdd(s, "churn", store.TierGPU, prompt(p)); err != nil {
			t.Fatal(err)
		}
		if round >= 20 {
			if _, err := testRemove(s, "churn", store.TierGPU, prompt(p-20)); err != nil {
				t.Fatal(err)
			}
		}
		if round == 0 {
			// The first churned prompts, stored among those that stay.
			for q := 1000; q < 1040; q++ {
				if _, err := testRemove(s, "churn", store.TierGPU, prompt(q)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	close(done)
	wg.Wait()
	checkInvariants(t, s)
	s.arena.mu.Lock()
	made := int64(s.arena.nums)
	s.arena.mu.Unlock()
	if segs := s.arena.segs.Load(); segs >= made || where(stay[0][0]) == first {
		t.Fatalf("%d segments of %d made are left, and the first prompt's records moved: %v; want compaction to have dropped segments and moved them",
			segs, made, where(stay[0][0]) != first)
	}
}

// TestArenaFull lowers the number of segments an arena may have: keys that
// find no record are skipped and counted, compaction that finds no room
// leaves its segment whole, and the store stays consistent.
func TestArenaFull(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{Shards: 4, CapacityBlocks: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.arena.maxSegs = 2
	keys := make([]uint64, 3*segSize)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	if err := testAdd(s, "a", store.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Keys >= len(keys) || st.Skipped == 0 || int64(st.Keys)+st.Skipped != int64(len(keys)) {
		t.Fatalf("stats %+v: want the keys that found no record skipped", st)
	}
	checkInvariants(t, s)
	// Free most records of both segments: compaction has no third segment
	// to move the rest to, and must leave them where they are.
	if _, err := testRemove(s, "a", store.TierGPU, keys[100:st.Keys-100]); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, s)
	out, err := s.Lookup(ctx, keys[:100], nil, nil)
	if err != nil || len(out) != 1 || out[0].Blocks != 100 {
		t.Fatalf("Lookup = %+v, %v", out, err)
	}
}

// TestFetchFromMovedRecords looks up a prompt from the records it had
// before compaction moved it, as a lookup that read the old segment just
// before the move does: the moved words read as dead, and the lookup must
// find the keys through the index, not call them absent.
func TestFetchFromMovedRecords(t *testing.T) {
	s, err := New(Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, 64)
	for i := range keys {
		keys[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	if err := testAdd(s, "a", store.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	filler := make([]uint64, segSize)
	for i := range filler {
		filler[i] = uint64(i+1000) * 0xbf58476d1ce4e5b9
	}
	if err := testAdd(s, "b", store.TierGPU, filler); err != nil {
		t.Fatal(err)
	}
	h := mix(keys[0])
	_, _, old, off, ok := s.shard(h).get(h)
	if !ok {
		t.Fatal("first key not found")
	}
	if _, err := testRemove(s, "b", store.TierGPU, filler); err != nil {
		t.Fatal(err)
	}
	for s.compact() {
	}
	if _, _, seg, _, _ := s.shard(h).get(h); seg == old {
		t.Fatal("the prompt's records did not move")
	}
	checkInvariants(t, s)
	sc := new(scratch)
	sc.seg, sc.off = old, off
	s.fetch(sc, keys[1:])
	for x := range keys[1:] {
		if w := sc.ws[x]; !holdsInline(w, s.ids["a"]) {
			t.Fatalf("key %d: word %#x from the old records, want pod a's", x+1, w)
		}
	}
}

// holdsInline reports whether inline word w has pod id as a holder.
func holdsInline(w uint64, id uint16) bool {
	_, _, ok := inlineFind(w, id)
	return w&ovfFlag == 0 && ok
}

// TestParentKeepsChainsTogether stores two requests' blocks as decoding
// does, one at a time and interleaved, after a prefill each: every block's
// record follows its parent's while the reserve lasts, and a new run
// starts when it is used up.
func TestParentKeepsChainsTogether(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	loc := func(k uint64) uintptr {
		h := mix(k)
		_, r, ok := s.shard(h).tbl.Load().find(&s.arena, h)
		if !ok {
			t.Fatalf("key %#x not found", k)
		}
		return uintptr(unsafe.Pointer(r))
	}
	const blocks = 3 * chainReserve
	a := make([]uint64, 8+blocks)
	b := make([]uint64, 8+blocks)
	for i := range a {
		a[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		b[i] = uint64(i+1) * 0xbf58476d1ce4e5b9
	}
	if err := testAdd(s, "p", store.TierGPU, a[:8]); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "q", store.TierGPU, b[:8]); err != nil {
		t.Fatal(err)
	}
	for i := 8; i < len(a); i++ {
		if err := testAddAfter(s, "p", store.TierGPU, a[i-1], a[i:i+1]); err != nil {
			t.Fatal(err)
		}
		if err := testAddAfter(s, "q", store.TierGPU, b[i-1], b[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, chain := range [][]uint64{a, b} {
		runs := 1
		for i := 1; i < len(chain); i++ {
			if loc(chain[i]) != loc(chain[i-1])+unsafe.Sizeof(rec{}) {
				runs++
			}
		}
		// The prefill's run and the decoded blocks after it (the first
		// chain continues in the head), then a run for each reserve.
		if runs > 1+blocks/(chainReserve+1)+1 {
			t.Errorf("chain stored in %d runs, want at most %d", runs, 1+blocks/(chainReserve+1)+1)
		}
		out, err := s.Lookup(ctx, chain, nil, nil)
		if err != nil || len(out) != 1 || out[0].Blocks != len(chain) {
			t.Fatalf("Lookup = %+v, %v", out, err)
		}
	}
	checkInvariants(t, s)
}

// TestCacheSizesBounded sets cache sizes for more pods than there are ids:
// the store keeps at most MaxPods, making room with pods it does not know,
// and a pod's size reaches it when it becomes known.
func TestCacheSizesBounded(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "live", store.TierGPU, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	s.SetCacheBlocks("live", 100)
	for i := range MaxPods + 100 {
		s.SetCacheBlocks(fmt.Sprintf("pod-%d", i), 10+i)
	}
	if n := len(s.cacheSizes); n > MaxPods || s.cacheSizes["live"] != 100 {
		t.Fatalf("%d cache sizes kept, live's %d; want at most %d and 100", n, s.cacheSizes["live"], MaxPods)
	}
	last := fmt.Sprintf("pod-%d", MaxPods+99)
	if err := testAdd(s, last, store.TierGPU, []uint64{2}); err != nil {
		t.Fatal(err)
	}
	if got := s.pods.cache[s.ids[last]].Load(); got != MaxPods+109 {
		t.Fatalf("cache size of %s = %d, want %d", last, got, MaxPods+109)
	}
	s.SetCacheBlocks("live", 0)
	if _, ok := s.cacheSizes["live"]; ok || s.pods.cache[s.ids["live"]].Load() != 0 {
		t.Fatalf("live's size still set after SetCacheBlocks(0)")
	}
}
