package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prefixd/prefixd/store"
)

// Bounded is a Store with a capacity: the sum of the block counts Pods
// reports never exceeds CapacityBlocks. The suite checks it for stores that
// implement it.
type Bounded interface {
	CapacityBlocks() int
}

// MaxBoundedCapacity is the largest capacity the suite fills to check a
// Bounded store; larger ones skip that check.
const MaxBoundedCapacity = 1 << 16

// Run runs the conformance suite. newStore returns a new, empty store for
// each subtest and arranges its cleanup with t.Cleanup. Apart from
// Capacity and FairShare, subtests add at most about 6,000 blocks and
// expect all of them kept: a bounded store needs room for that many.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		f    func(t *testing.T, s *subject)
	}{
		{"EmptyQuery", testEmptyQuery},
		{"EmptyStore", testEmptyStore},
		{"Chain", testChain},
		{"ParentHint", testParentHint},
		{"MissInMiddle", testMissInMiddle},
		{"FirstKeyMissing", testFirstKeyMissing},
		{"PodFilter", testPodFilter},
		{"ExtremeKeys", testExtremeKeys},
		{"Idempotent", testIdempotent},
		{"RemoveUnknown", testRemoveUnknown},
		{"RemoveLastBlock", testRemoveLastBlock},
		{"Tiers", testTiers},
		{"ForgetPod", testForgetPod},
		{"PodsCounts", testPodsCounts},
		{"ManyHolders", testManyHolders},
		{"LongQuery", testLongQuery},
		{"OutReuse", testOutReuse},
		{"InvalidInput", testInvalidInput},
		{"CanceledContext", testCanceledContext},
		{"BatchOrder", testBatchOrder},
		{"Duplicate", testDuplicate},
		{"AppliedSeq", testAppliedSeq},
		{"ForgetSeq", testForgetSeq},
		{"ClearKeepsSeq", testClearKeepsSeq},
		{"InvalidBatch", testInvalidBatch},
		{"PartialFailure", testPartialFailure},
		{"EngineMap", testEngineMap},
		{"EngineTiers", testEngineTiers},
		{"EngineKeys", testEngineKeys},
		{"Stale", testStale},
		{"PodsState", testPodsState},
		{"ModelState", testModelState},
		{"Concurrent", testConcurrent},
		{"Capacity", testCapacity},
		{"FairShare", testFairShare},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.f(t, &subject{Store: newStore(t)}) })
	}
}

// Keys returns n distinct pseudo-random keys for seed, spread over all 64
// bits like engine hashes.
func Keys(seed uint64, n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = Mix(seed<<32 + uint64(i))
	}
	return ks
}

// subject is a store under test and the seq of each pod's last batch, so
// that helpers can apply each change as a batch of its own at the next
// seq.
type subject struct {
	store.Store
	mu   sync.Mutex
	seqs map[string]uint64 // the last seq the helpers applied, by pod
}

// next returns the seq of pod's next batch.
func (s *subject) next(pod string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs == nil {
		s.seqs = make(map[string]uint64)
	}
	s.seqs[pod]++
	return s.seqs[pod]
}

// setSeq records seq as pod's last.
func (s *subject) setSeq(pod string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs == nil {
		s.seqs = make(map[string]uint64)
	}
	s.seqs[pod] = seq
}

// seq returns pod's last seq, and false when it has none.
func (s *subject) seq(pod string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.seqs[pod]
	return seq, ok
}

func (s *subject) forgotten(pod string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seqs, pod)
}

func addOp(tier store.Tier, keys ...uint64) store.Op {
	return store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys}
}

func removeOp(tier store.Tier, keys ...uint64) store.Op {
	return store.Op{Kind: store.OpRemove, Tier: tier, Keys: keys}
}

func clearOp() store.Op { return store.Op{Kind: store.OpClear} }

// pairsOp adds keys on tier with their engine hashes (tokens key mode).
func pairsOp(tier store.Tier, keys, engine []uint64) store.Op {
	return store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys, Engine: engine}
}

// engineOp adds or removes blocks named by engine hash.
func engineOp(kind store.OpKind, tier store.Tier, engine ...uint64) store.Op {
	return store.Op{Kind: kind, Tier: tier, Engine: engine}
}

// apply applies ops to pod as one batch at the pod's next seq and checks
// that it applied.
func apply(t testing.TB, s *subject, pod string, ops ...store.Op) store.Result {
	t.Helper()
	return applyAt(t, s, pod, s.next(pod), ops...)
}

// applyAt applies ops to pod as one batch of seq and checks that it
// applied.
func applyAt(t testing.TB, s *subject, pod string, seq uint64, ops ...store.Op) store.Result {
	t.Helper()
	res, err := s.Apply(context.Background(), pod, &store.Batch{Seq: seq, Ops: ops})
	if err != nil {
		t.Fatalf("Apply(%q, seq %d, %d ops): %v", pod, seq, len(ops), err)
	}
	if res.Duplicate || res.AppliedSeq != seq {
		t.Fatalf("Apply(%q, seq %d) = %+v, want applied through %d", pod, seq, res, seq)
	}
	s.setSeq(pod, seq)
	return res
}

// wantDuplicate applies ops to pod at seq, which must be a duplicate of a
// pod whose applied seq is applied.
func wantDuplicate(t testing.TB, s *subject, pod string, seq, applied uint64, ops ...store.Op) {
	t.Helper()
	res, err := s.Apply(context.Background(), pod, &store.Batch{Seq: seq, Ops: ops})
	if want := (store.Result{Duplicate: true, AppliedSeq: applied}); err != nil || res != want {
		t.Fatalf("Apply(%q, seq %d) = %+v, %v; want %+v", pod, seq, res, err, want)
	}
}

func add(t testing.TB, s *subject, pod string, tier store.Tier, keys ...uint64) {
	t.Helper()
	apply(t, s, pod, addOp(tier, keys...))
}

// addAfter adds keys that continue a chain whose last block is parent.
func addAfter(t testing.TB, s *subject, pod string, tier store.Tier, parent uint64, keys ...uint64) {
	t.Helper()
	apply(t, s, pod, store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys, Parent: parent, HasParent: true})
}

// remove removes keys and returns how many holdings went, checking that
// the others are counted as unknown.
func remove(t testing.TB, s *subject, pod string, tier store.Tier, keys ...uint64) int {
	t.Helper()
	res := apply(t, s, pod, removeOp(tier, keys...))
	if res.Removed+res.Unknown != len(keys) {
		t.Fatalf("Apply(%q, remove %d keys) = %+v: removed and unknown do not add up", pod, len(keys), res)
	}
	return res.Removed
}

func forget(t testing.TB, s *subject, pod string) {
	t.Helper()
	if err := s.ForgetPod(context.Background(), pod); err != nil {
		t.Fatalf("ForgetPod(%q): %v", pod, err)
	}
	s.forgotten(pod)
}

func setStale(t testing.TB, s *subject, pod string, stale bool) {
	t.Helper()
	if err := s.SetStale(context.Background(), pod, stale); err != nil {
		t.Fatalf("SetStale(%q, %v): %v", pod, stale, err)
	}
}

// wantSeq checks pod's applied seq as AppliedSeq reports it.
func wantSeq(t testing.TB, s *subject, pod string, seq uint64, ok bool) {
	t.Helper()
	got, gotOK, err := s.AppliedSeq(context.Background(), pod)
	if err != nil || got != seq || gotOK != ok {
		t.Fatalf("AppliedSeq(%q) = %d, %v, %v; want %d, %v", pod, got, gotOK, err, seq, ok)
	}
}

// engineKeys returns what EngineKeys says of hashes for pod.
func engineKeys(t testing.TB, s *subject, pod string, hashes ...uint64) ([]uint64, []bool) {
	t.Helper()
	keys, found, err := s.EngineKeys(context.Background(), pod, hashes, nil, nil)
	if err != nil {
		t.Fatalf("EngineKeys(%q, %d hashes): %v", pod, len(hashes), err)
	}
	if len(keys) != len(hashes) || len(found) != len(hashes) {
		t.Fatalf("EngineKeys(%q, %d hashes) = %d keys, %d found", pod, len(hashes), len(keys), len(found))
	}
	return keys, found
}

// wantEngine checks that pod's engine-hash map resolves hashes[i] to
// keys[i] where keys[i] is not 0, and does not resolve it where it is.
func wantEngine(t testing.TB, s *subject, pod string, hashes, keys []uint64) {
	t.Helper()
	gotKeys, found := engineKeys(t, s, pod, hashes...)
	for i, h := range hashes {
		if want := keys[i] != 0; found[i] != want || want && gotKeys[i] != keys[i] {
			t.Fatalf("EngineKeys(%q): hash %#x (#%d) = %#x, found %v; want %#x, found %v", pod, h, i, gotKeys[i], found[i], keys[i], want)
		}
	}
}

// tiers builds a TierBlocks value.
func tiers(gpu, cpu, disk int) [store.NumTiers]int { return [store.NumTiers]int{gpu, cpu, disk} }

func gpu(n int) store.Match { return store.Match{Blocks: n, TierBlocks: tiers(n, 0, 0)} }

func stale(m store.Match) store.Match {
	m.Stale = true
	return m
}

// lookup returns the matches by pod, failing on duplicates.
func lookup(t testing.TB, s store.Store, keys []uint64, pods ...string) map[string]store.Match {
	t.Helper()
	out, err := s.Lookup(context.Background(), keys, pods, nil)
	if err != nil {
		t.Fatalf("Lookup(%d keys, pods %q): %v", len(keys), pods, err)
	}
	return byPod(t, out)
}

func byPod(t testing.TB, out []store.Match) map[string]store.Match {
	t.Helper()
	m := make(map[string]store.Match, len(out))
	for _, mt := range out {
		if _, dup := m[mt.Pod]; dup {
			t.Fatalf("Lookup returned pod %q twice: %+v", mt.Pod, out)
		}
		if mt.Blocks < 1 {
			t.Fatalf("Lookup returned a match of %d blocks: %+v", mt.Blocks, mt)
		}
		sum := 0
		for _, n := range mt.TierBlocks {
			sum += n
		}
		if sum != mt.Blocks {
			t.Fatalf("Lookup match %+v: tier blocks sum to %d, want %d", mt, sum, mt.Blocks)
		}
		pod := mt.Pod
		mt.Pod = ""
		m[pod] = mt
	}
	return m
}

func wantMatches(t testing.TB, got map[string]store.Match, want map[string]store.Match) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Fatalf("Lookup:\n got %s\nwant %s", fmtMatches(got), fmtMatches(want))
	}
}

func fmtMatches(m map[string]store.Match) string {
	s := "{"
	for _, p := range slices.Sorted(maps.Keys(m)) {
		s += fmt.Sprintf(" %s:%d%v", p, m[p].Blocks, m[p].TierBlocks)
		if m[p].Incomplete {
			s += "/incomplete"
		}
		if m[p].Stale {
			s += "/stale"
		}
	}
	return s + " }"
}

func pods(t testing.TB, s store.Store) []store.PodInfo {
	t.Helper()
	ps, err := s.Pods(context.Background())
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	return ps
}

// wantPods checks what Pods lists. A wanted pod without HasSeq gets the
// seq the helpers last applied to it, if any.
func wantPods(t testing.TB, s *subject, want ...store.PodInfo) {
	t.Helper()
	want = slices.Clone(want)
	for i := range want {
		if seq, ok := s.seq(want[i].Name); ok && !want[i].HasSeq {
			want[i].AppliedSeq, want[i].HasSeq = seq, true
		}
	}
	got := pods(t, s)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Pods:\n got %+v\nwant %+v", got, want)
	}
}

func testEmptyQuery(t *testing.T, s *subject) {
	add(t, s, "a", store.TierGPU, Keys(1, 4)...)
	for _, keys := range [][]uint64{nil, {}} {
		junk := []store.Match{{Pod: "junk", Blocks: 3}}
		out, err := s.Lookup(context.Background(), keys, nil, junk)
		if err != nil || len(out) != 0 {
			t.Fatalf("Lookup(%v) = %+v, %v; want no matches", keys, out, err)
		}
		out, err = s.Lookup(context.Background(), keys, []string{"a"}, nil)
		if err != nil || len(out) != 0 {
			t.Fatalf("Lookup(%v, [a]) = %+v, %v; want no matches", keys, out, err)
		}
	}
}

func testEmptyStore(t *testing.T, s *subject) {
	keys := Keys(2, 8)
	wantMatches(t, lookup(t, s, keys), map[string]store.Match{})
	wantMatches(t, lookup(t, s, keys, "a"), map[string]store.Match{})
	wantPods(t, s)
	wantSeq(t, s, "a", 0, false)
	if n := remove(t, s, "a", store.TierGPU, keys...); n != 0 {
		t.Fatalf("Remove on an empty store = %d, want 0", n)
	}
	// The pod that applied a batch is known by its seq alone.
	wantPods(t, s, store.PodInfo{Name: "a"})
	wantMatches(t, lookup(t, s, keys, "a"), map[string]store.Match{})
	forget(t, s, "a")
	wantPods(t, s)
	forget(t, s, "a")
	wantPods(t, s)
}

func testChain(t *testing.T, s *subject) {
	chain := Keys(3, 20)
	add(t, s, "a", store.TierGPU, chain[:10]...)
	wantMatches(t, lookup(t, s, chain[:10]), map[string]store.Match{"a": gpu(10)})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(10)})
	wantMatches(t, lookup(t, s, chain[:5]), map[string]store.Match{"a": gpu(5)})
	wantMatches(t, lookup(t, s, chain[:1]), map[string]store.Match{"a": gpu(1)})
	// Keys are independent: a run may start anywhere.
	wantMatches(t, lookup(t, s, chain[4:]), map[string]store.Match{"a": gpu(6)})
	wantMatches(t, lookup(t, s, chain[10:]), map[string]store.Match{})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 10})
}

// testParentHint checks that an OpAdd's Parent is only a hint: the
// results are those of an OpAdd without one, whatever the parent is, held
// by the pod, by another pod, by none, or a block in the middle of a
// chain.
func testParentHint(t *testing.T, s *subject) {
	chain := Keys(30, 40)
	add(t, s, "a", store.TierGPU, chain[:4]...)
	addAfter(t, s, "a", store.TierGPU, chain[3], chain[4:8]...)
	// Decoding: one block at a time.
	for i := 8; i < 20; i++ {
		addAfter(t, s, "a", store.TierGPU, chain[i-1], chain[i])
	}
	addAfter(t, s, "b", store.TierGPU, chain[19], chain[20:24]...) // a parent b does not hold
	addAfter(t, s, "a", store.TierGPU, Keys(31, 1)[0], chain[24:26]...)
	addAfter(t, s, "a", store.TierGPU, chain[1], chain[26:30]...) // a parent whose successors are taken
	addAfter(t, s, "a", store.TierGPU, chain[5], chain[5:8]...)   // keys already held
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(20)})
	wantMatches(t, lookup(t, s, chain[20:]), map[string]store.Match{"b": gpu(4)})
	wantMatches(t, lookup(t, s, chain[24:30]), map[string]store.Match{"a": gpu(6)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 26}, store.PodInfo{Name: "b", Blocks: 4})
	// Removal and re-adding after a parent keep the answers right.
	remove(t, s, "a", store.TierGPU, chain[10:12]...)
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(10)})
	addAfter(t, s, "a", store.TierGPU, chain[9], chain[10:12]...)
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(20)})
	// A decode step in one batch with the prefill it follows.
	apply(t, s, "c", addOp(store.TierGPU, chain[30:36]...),
		store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: chain[36:37], Parent: chain[35], HasParent: true},
		store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: chain[37:40], Parent: chain[36], HasParent: true})
	wantMatches(t, lookup(t, s, chain[30:]), map[string]store.Match{"c": gpu(10)})
}

func testMissInMiddle(t *testing.T, s *subject) {
	chain := Keys(4, 10)
	add(t, s, "a", store.TierGPU, chain[:5]...)
	add(t, s, "a", store.TierGPU, chain[6:]...)
	add(t, s, "b", store.TierGPU, chain...)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(5), "b": gpu(10)})
	// The walk goes on past a's miss for b, then stops for b too.
	remove(t, s, "b", store.TierGPU, chain[7])
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(5), "b": gpu(7)})
	// A key nobody holds ends every run.
	q := slices.Concat(chain[:3], Keys(40, 1), chain[3:])
	wantMatches(t, lookup(t, s, q), map[string]store.Match{"a": gpu(3), "b": gpu(3)})
}

func testFirstKeyMissing(t *testing.T, s *subject) {
	chain := Keys(5, 10)
	add(t, s, "a", store.TierGPU, chain[1:]...)
	add(t, s, "b", store.TierGPU, chain[0])
	add(t, s, "b", store.TierGPU, chain[2:]...)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"b": gpu(1)})
	wantMatches(t, lookup(t, s, chain, "a"), map[string]store.Match{})
}

func testPodFilter(t *testing.T, s *subject) {
	chain := Keys(6, 10)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "b", store.TierGPU, chain[:4]...)
	add(t, s, "c", store.TierGPU, Keys(60, 10)...)
	all := map[string]store.Match{"a": gpu(10), "b": gpu(4)}
	wantMatches(t, lookup(t, s, chain), all)
	wantMatches(t, lookup(t, s, chain, "a", "b", "c"), all)
	wantMatches(t, lookup(t, s, chain, "b"), map[string]store.Match{"b": gpu(4)})
	wantMatches(t, lookup(t, s, chain, "a", "nope", "a"), map[string]store.Match{"a": gpu(10)})
	// A filter that leaves nobody holding the first key.
	wantMatches(t, lookup(t, s, chain, "c"), map[string]store.Match{})
	// Unknown names match nothing; they do not mean "every pod".
	wantMatches(t, lookup(t, s, chain, "nope"), map[string]store.Match{})
	wantMatches(t, lookup(t, s, chain, ""), map[string]store.Match{})
	// Nor do pods known without blocks.
	apply(t, s, "empty")
	setStale(t, s, "marked", true)
	wantMatches(t, lookup(t, s, chain, "empty", "marked"), map[string]store.Match{})
}

func testExtremeKeys(t *testing.T, s *subject) {
	chain := []uint64{0, 1<<64 - 1, 1 << 63, 1, 1<<63 - 1, 2}
	add(t, s, "a", store.TierGPU, chain...)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(6)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 6})
	if n := remove(t, s, "a", store.TierGPU, 0); n != 1 {
		t.Fatalf("Remove(key 0) = %d, want 1", n)
	}
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{})
	wantMatches(t, lookup(t, s, chain[1:]), map[string]store.Match{"a": gpu(5)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 5})
	add(t, s, "b", store.TierGPU, 0)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"b": gpu(1)})
	if n := remove(t, s, "a", store.TierGPU, 1<<64-1); n != 1 {
		t.Fatalf("Remove(key 2^64-1) = %d, want 1", n)
	}
	wantMatches(t, lookup(t, s, chain[1:]), map[string]store.Match{})
	// Extreme engine hashes resolve like any other.
	hashes := []uint64{1<<64 - 1, 0}
	apply(t, s, "c", pairsOp(store.TierGPU, chain[4:], hashes))
	wantEngine(t, s, "c", hashes, chain[4:])
	if res := apply(t, s, "c", engineOp(store.OpRemove, store.TierGPU, 0, 1<<64-1)); res.Removed != 2 {
		t.Fatalf("remove by engine hashes 0 and 2^64-1 = %+v, want 2 removed", res)
	}
}

func testIdempotent(t *testing.T, s *subject) {
	chain := Keys(7, 8)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierGPU, chain[2], chain[2], chain[3])
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 8})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(8)})
	// The same key twice in one remove is removed once.
	if n := remove(t, s, "a", store.TierGPU, chain[7], chain[7], chain[6]); n != 2 {
		t.Fatalf("Remove(k7, k7, k6) = %d, want 2", n)
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 6})
	// A query may repeat a key.
	q := []uint64{chain[0], chain[0], chain[1], chain[0]}
	wantMatches(t, lookup(t, s, q), map[string]store.Match{"a": gpu(4)})
}

func testRemoveUnknown(t *testing.T, s *subject) {
	chain := Keys(8, 4)
	add(t, s, "a", store.TierGPU, chain...)
	for _, tc := range []struct {
		pod  string
		tier store.Tier
		keys []uint64
	}{
		{"nope", store.TierGPU, chain},
		{"a", store.TierGPU, Keys(80, 3)},
		{"a", store.TierCPU, chain},
		{"a", store.TierDisk, chain[:1]},
		{"a", store.TierGPU, nil},
	} {
		if n := remove(t, s, tc.pod, tc.tier, tc.keys...); n != 0 {
			t.Fatalf("Remove(%q, %v, %d keys) = %d, want 0", tc.pod, tc.tier, len(tc.keys), n)
		}
	}
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(4)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 4}, store.PodInfo{Name: "nope"})
}

func testRemoveLastBlock(t *testing.T, s *subject) {
	k := Keys(9, 1)
	add(t, s, "a", store.TierCPU, k...)
	add(t, s, "b", store.TierGPU, Keys(90, 2)...)
	if n := remove(t, s, "a", store.TierCPU, k...); n != 1 {
		t.Fatalf("Remove = %d, want 1", n)
	}
	// a holds nothing and is still known, by its seq.
	wantPods(t, s, store.PodInfo{Name: "a"}, store.PodInfo{Name: "b", Blocks: 2})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{})
	add(t, s, "a", store.TierGPU, k...)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 1}, store.PodInfo{Name: "b", Blocks: 2})
}

func testTiers(t *testing.T, s *subject) {
	chain := Keys(10, 8)
	add(t, s, "a", store.TierGPU, chain[:4]...)
	add(t, s, "a", store.TierCPU, chain[:6]...)
	add(t, s, "a", store.TierDisk, chain[5:8]...)
	// Each block counts once, on its fastest tier.
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": {Blocks: 8, TierBlocks: tiers(4, 2, 2)}})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 8})

	// Removing GPU copies leaves the CPU ones.
	if n := remove(t, s, "a", store.TierGPU, chain...); n != 4 {
		t.Fatalf("Remove(GPU) = %d, want 4", n)
	}
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": {Blocks: 8, TierBlocks: tiers(0, 6, 2)}})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 8})

	// Removing the CPU copies breaks the run where only CPU held a block.
	if n := remove(t, s, "a", store.TierCPU, chain[:5]...); n != 5 {
		t.Fatalf("Remove(CPU) = %d, want 5", n)
	}
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{})
	wantMatches(t, lookup(t, s, chain[5:]), map[string]store.Match{"a": {Blocks: 3, TierBlocks: tiers(0, 1, 2)}})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3})

	// Tiers are per pod: b on GPU does not lift a's tier.
	add(t, s, "b", store.TierGPU, chain[5:]...)
	wantMatches(t, lookup(t, s, chain[5:]), map[string]store.Match{
		"a": {Blocks: 3, TierBlocks: tiers(0, 1, 2)},
		"b": gpu(3),
	})
}

// testForgetPod checks that ForgetPod removes every block of a pod, and
// the pod itself: a later batch starts a new pod.
func testForgetPod(t *testing.T, s *subject) {
	chain := Keys(11, 10)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierCPU, chain[:3]...)
	add(t, s, "a", store.TierGPU, Keys(110, 50)...)
	add(t, s, "b", store.TierGPU, chain[:6]...)
	forget(t, s, "a")
	wantPods(t, s, store.PodInfo{Name: "b", Blocks: 6})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"b": gpu(6)})
	wantMatches(t, lookup(t, s, chain, "a"), map[string]store.Match{})
	if n := remove(t, s, "a", store.TierGPU, chain...); n != 0 {
		t.Fatalf("Remove after ForgetPod = %d, want 0", n)
	}
	forget(t, s, "a")
	forget(t, s, "nope")
	wantPods(t, s, store.PodInfo{Name: "b", Blocks: 6})

	// A forgotten pod starts again from nothing.
	add(t, s, "a", store.TierCPU, chain[:2]...)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2}, store.PodInfo{Name: "b", Blocks: 6})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": {Blocks: 2, TierBlocks: tiers(0, 2, 0)}, "b": gpu(6)})

	forget(t, s, "b")
	forget(t, s, "a")
	wantPods(t, s)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{})
}

func testPodsCounts(t *testing.T, s *subject) {
	var want []store.PodInfo
	for i := range 5 {
		name := fmt.Sprintf("10.0.0.%d:8000", 5-i)
		keys := Keys(uint64(120+i), 3*i+1)
		add(t, s, name, store.TierGPU, keys...)
		add(t, s, name, store.TierCPU, keys[:i]...)
		want = append(want, store.PodInfo{Name: name, Blocks: 3*i + 1})
	}
	// Shared keys count for each pod that holds them.
	shared := Keys(129, 2)
	add(t, s, "10.0.0.1:8000", store.TierGPU, shared...)
	add(t, s, "10.0.0.2:8000", store.TierDisk, shared...)
	want[3].Blocks += 2
	want[4].Blocks += 2
	slices.SortFunc(want, func(a, b store.PodInfo) int { return cmp.Compare(a.Name, b.Name) })
	wantPods(t, s, want...)
}

func testManyHolders(t *testing.T, s *subject) {
	const n = 100
	shared := Keys(13, 8)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%03d", i)
		add(t, s, names[i], store.TierGPU, shared...)
		add(t, s, names[i], store.TierGPU, Keys(uint64(1300+i), i%5)...)
	}
	q := slices.Concat(shared, Keys(1307, 2))
	want := map[string]store.Match{}
	for i, name := range names {
		want[name] = gpu(8)
		if i == 7 {
			want[name] = gpu(10)
		}
	}
	wantMatches(t, lookup(t, s, q), want)

	// Half of the holders lose a middle block.
	for i := 0; i < n; i += 2 {
		remove(t, s, names[i], store.TierGPU, shared[3])
	}
	want = map[string]store.Match{}
	for i, name := range names {
		want[name] = gpu(8 - 5*((i+1)%2))
	}
	wantMatches(t, lookup(t, s, shared), want)

	// A filter picks some of them.
	sub := map[string]store.Match{"pod-010": gpu(3), "pod-011": gpu(8), "pod-007": gpu(10)}
	wantMatches(t, lookup(t, s, q, "pod-010", "pod-011", "pod-007"), sub)

	// Holders leave one by one down to none.
	for i := range n - 2 {
		remove(t, s, names[i], store.TierGPU, shared[0])
	}
	wantMatches(t, lookup(t, s, shared[:1]), map[string]store.Match{names[n-2]: gpu(1), names[n-1]: gpu(1)})
	remove(t, s, names[n-2], store.TierGPU, shared[0])
	wantMatches(t, lookup(t, s, shared[:1]), map[string]store.Match{names[n-1]: gpu(1)})
	add(t, s, names[0], store.TierCPU, shared[0])
	add(t, s, names[1], store.TierGPU, shared[0])
	add(t, s, names[2], store.TierDisk, shared[0])
	add(t, s, names[3], store.TierCPU, shared[0])
	wantMatches(t, lookup(t, s, shared[:1]), map[string]store.Match{
		names[0]:   {Blocks: 1, TierBlocks: tiers(0, 1, 0)},
		names[1]:   gpu(1),
		names[2]:   {Blocks: 1, TierBlocks: tiers(0, 0, 1)},
		names[3]:   {Blocks: 1, TierBlocks: tiers(0, 1, 0)},
		names[n-1]: gpu(1),
	})
	for _, i := range []int{0, 1, 2, 3, n - 1} {
		forget(t, s, names[i])
	}
	wantMatches(t, lookup(t, s, shared[:1]), map[string]store.Match{})
	var wantInfo []store.PodInfo
	for i := 4; i < n-1; i++ {
		wantInfo = append(wantInfo, store.PodInfo{Name: names[i], Blocks: 7 - (i+1)%2 + i%5})
	}
	wantPods(t, s, wantInfo...)
}

func testLongQuery(t *testing.T, s *subject) {
	chain := Keys(14, 1000)
	add(t, s, "all", store.TierGPU, chain...)
	want := map[string]store.Match{"all": gpu(1000)}
	// Misses at and around every boundary a backend might batch on.
	for _, p := range []int{1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 999} {
		name := fmt.Sprintf("miss-%d", p)
		add(t, s, name, store.TierGPU, chain[:p]...)
		add(t, s, name, store.TierGPU, chain[p+1:min(p+9, len(chain))]...)
		want[name] = gpu(p)
	}
	wantMatches(t, lookup(t, s, chain), want)
	wantMatches(t, lookup(t, s, chain, "miss-513"), map[string]store.Match{"miss-513": gpu(513)})
}

func testOutReuse(t *testing.T, s *subject) {
	chain := Keys(15, 4)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "b", store.TierGPU, chain[:2]...)
	out := make([]store.Match, 5, 16)
	for i := range out {
		out[i] = store.Match{Pod: "junk", Blocks: 99}
	}
	for range 3 {
		var err error
		out, err = s.Lookup(context.Background(), chain, nil, out)
		if err != nil {
			t.Fatal(err)
		}
		wantMatches(t, byPod(t, out), map[string]store.Match{"a": gpu(4), "b": gpu(2)})
	}
	out, err := s.Lookup(context.Background(), chain, []string{"b"}, out)
	if err != nil {
		t.Fatal(err)
	}
	wantMatches(t, byPod(t, out), map[string]store.Match{"b": gpu(2)})
}

func testInvalidInput(t *testing.T, s *subject) {
	ctx := context.Background()
	keys := Keys(16, 2)
	batch := &store.Batch{Seq: 1, Ops: []store.Op{addOp(store.TierGPU, keys...)}}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"Apply empty pod", second(s.Apply(ctx, "", batch)), store.ErrInvalidPod},
		{"Apply bad tier", second(s.Apply(ctx, "a", &store.Batch{Ops: []store.Op{addOp(store.NumTiers, keys...)}})), store.ErrInvalidTier},
		{"Apply tier 255", second(s.Apply(ctx, "a", &store.Batch{Ops: []store.Op{removeOp(255, keys...)}})), store.ErrInvalidTier},
		{"AppliedSeq empty pod", third(s.AppliedSeq(ctx, "")), store.ErrInvalidPod},
		{"ForgetPod empty pod", s.ForgetPod(ctx, ""), store.ErrInvalidPod},
		{"SetStale empty pod", s.SetStale(ctx, "", true), store.ErrInvalidPod},
		{"EngineKeys empty pod", third(s.EngineKeys(ctx, "", keys, nil, nil)), store.ErrInvalidPod},
		{"DecideKeyMode empty model", second(s.DecideKeyMode(ctx, "", store.KeyModeEngine)), store.ErrInvalidName},
		{"DecideKeyMode bad mode", second(s.DecideKeyMode(ctx, "m", "auto")), store.ErrInvalidName},
		{"DecideKeyMode empty mode", second(s.DecideKeyMode(ctx, "m", "")), store.ErrInvalidName},
		{"AddLoRA empty adapter", second(s.AddLoRA(ctx, "", "m")), store.ErrInvalidName},
		{"AddLoRA empty base", second(s.AddLoRA(ctx, "l", "")), store.ErrInvalidName},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	wantPods(t, s)
	wantModels(t, s, map[string]store.ModelState{})
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

func testCanceledContext(t *testing.T, s *subject) {
	keys := Keys(17, 2)
	add(t, s, "a", store.TierGPU, keys...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, err := range map[string]error{
		"Apply":         second(s.Apply(ctx, "a", &store.Batch{Seq: 2, Ops: []store.Op{clearOp()}})),
		"Apply new pod": second(s.Apply(ctx, "b", &store.Batch{Seq: 1, Ops: []store.Op{addOp(store.TierGPU, keys...)}})),
		"AppliedSeq":    third(s.AppliedSeq(ctx, "a")),
		"ForgetPod":     s.ForgetPod(ctx, "a"),
		"SetStale":      s.SetStale(ctx, "a", true),
		"EngineKeys":    third(s.EngineKeys(ctx, "a", keys, nil, nil)),
		"Lookup":        second(s.Lookup(ctx, keys, nil, nil)),
		"Pods":          second(s.Pods(ctx)),
		"Models":        second(s.Models(ctx)),
		"DecideKeyMode": second(s.DecideKeyMode(ctx, "m", store.KeyModeEngine)),
		"AddLoRA":       second(s.AddLoRA(ctx, "l", "m")),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: error %v, want context.Canceled", name, err)
		}
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2})
	wantModels(t, s, map[string]store.ModelState{})
}

// testBatchOrder checks that a batch's ops apply in order, each seeing
// what the ones before it did, and that the Result adds them up.
func testBatchOrder(t *testing.T, s *subject) {
	k := Keys(23, 8)
	res := apply(t, s, "a",
		addOp(store.TierGPU, k[:6]...),
		removeOp(store.TierGPU, k[4:6]...), // held: removed
		addOp(store.TierCPU, k[5]),
		removeOp(store.TierCPU, k[0]),  // on GPU only: unknown
		removeOp(store.TierDisk, k[1]), // unknown
		removeOp(store.TierGPU, k[6]),  // never added: unknown
		addOp(store.TierGPU, k[6:8]...),
	)
	if want := (store.Result{AppliedSeq: 1, Removed: 2, Unknown: 3}); res != want {
		t.Fatalf("Apply = %+v, want %+v", res, want)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(4)})
	wantMatches(t, lookup(t, s, k[5:]), map[string]store.Match{"a": {Blocks: 3, TierBlocks: tiers(2, 1, 0)}})
	// Removed then added again in one batch: held; added then removed: not.
	res = apply(t, s, "a",
		removeOp(store.TierGPU, k[:4]...),
		addOp(store.TierGPU, k[:2]...),
		addOp(store.TierDisk, k[2]),
		removeOp(store.TierDisk, k[2]),
	)
	if want := (store.Result{AppliedSeq: 2, Removed: 5}); res != want {
		t.Fatalf("Apply = %+v, want %+v", res, want)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(2)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 5})
	// An empty batch moves the seq and nothing else.
	if res := apply(t, s, "a"); res != (store.Result{AppliedSeq: 3}) {
		t.Fatalf("Apply of no ops = %+v", res)
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 5})
}

// testDuplicate checks that a batch at or below the applied seq changes
// nothing, whatever it holds, and reports the applied seq.
func testDuplicate(t *testing.T, s *subject) {
	k := Keys(20, 8)
	applyAt(t, s, "a", 1, addOp(store.TierGPU, k[:4]...))
	applyAt(t, s, "a", 5, addOp(store.TierGPU, k[4:6]...))
	applyAt(t, s, "b", 9, addOp(store.TierCPU, k[:2]...))
	setStale(t, s, "a", true)
	for _, seq := range []uint64{5, 4, 2, 1, 0} {
		wantDuplicate(t, s, "a", seq, 5,
			removeOp(store.TierGPU, k...),
			clearOp(),
			addOp(store.TierCPU, k[6:]...),
		)
	}
	// An invalid duplicate is still refused as invalid.
	if _, err := s.Apply(context.Background(), "a", &store.Batch{Seq: 1, Ops: []store.Op{{Kind: 99}}}); !errors.Is(err, store.ErrInvalidBatch) {
		t.Fatalf("Apply of an invalid duplicate: %v, want ErrInvalidBatch", err)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": stale(gpu(6)), "b": {Blocks: 2, TierBlocks: tiers(0, 2, 0)}})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 6, Stale: true}, store.PodInfo{Name: "b", Blocks: 2})
	wantSeq(t, s, "a", 5, true)
	// The next seq applies; seqs are per pod.
	if res := applyAt(t, s, "a", 6, removeOp(store.TierGPU, k[5])); res.Removed != 1 {
		t.Fatalf("Apply after duplicates = %+v, want 1 removed", res)
	}
	wantDuplicate(t, s, "b", 5, 9, clearOp())
	applyAt(t, s, "c", 1, addOp(store.TierGPU, k[:1]...))
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 5, Stale: true}, store.PodInfo{Name: "b", Blocks: 2}, store.PodInfo{Name: "c", Blocks: 1})
}

// testAppliedSeq checks the applied seq as Apply, AppliedSeq and Pods
// report it.
func testAppliedSeq(t *testing.T, s *subject) {
	wantSeq(t, s, "a", 0, false)
	// A pod's first batch applies whatever its seq, 0 included.
	if res := applyAt(t, s, "a", 0); res != (store.Result{AppliedSeq: 0}) {
		t.Fatalf("first Apply at seq 0 = %+v", res)
	}
	wantSeq(t, s, "a", 0, true)
	wantPods(t, s, store.PodInfo{Name: "a", HasSeq: true})
	wantDuplicate(t, s, "a", 0, 0, addOp(store.TierGPU, 1))
	// Seqs may jump: a gap is the caller's to notice.
	applyAt(t, s, "a", 7, addOp(store.TierGPU, Keys(21, 3)...))
	wantSeq(t, s, "a", 7, true)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3, AppliedSeq: 7, HasSeq: true})
	applyAt(t, s, "b", 1<<64-1)
	wantDuplicate(t, s, "b", 1<<64-1, 1<<64-1)
	wantDuplicate(t, s, "b", 1<<63, 1<<64-1)
	wantSeq(t, s, "b", 1<<64-1, true)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3}, store.PodInfo{Name: "b"})
	// A pod known only by its stale mark has no seq.
	setStale(t, s, "c", true)
	wantSeq(t, s, "c", 0, false)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3}, store.PodInfo{Name: "b"}, store.PodInfo{Name: "c", Stale: true})
}

// testForgetSeq checks that ForgetPod forgets all of a pod: blocks, seq,
// stale mark and engine-hash map, so that seq 1 applies again after it.
func testForgetSeq(t *testing.T, s *subject) {
	k, e := Keys(22, 6), Keys(220, 6)
	applyAt(t, s, "a", 10, pairsOp(store.TierGPU, k, e))
	setStale(t, s, "a", true)
	applyAt(t, s, "b", 3, addOp(store.TierGPU, k[:2]...))
	forget(t, s, "a")
	wantSeq(t, s, "a", 0, false)
	wantPods(t, s, store.PodInfo{Name: "b", Blocks: 2})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"b": gpu(2)})
	wantEngine(t, s, "a", e, make([]uint64, len(e)))
	// The engine restarted: its seqs start again.
	if res := applyAt(t, s, "a", 1, addOp(store.TierCPU, k[:3]...)); res != (store.Result{AppliedSeq: 1}) {
		t.Fatalf("Apply at seq 1 after ForgetPod = %+v", res)
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3}, store.PodInfo{Name: "b", Blocks: 2})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": {Blocks: 3, TierBlocks: tiers(0, 3, 0)}, "b": gpu(2)})
	// Its old hashes mean nothing to the new pod.
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierCPU, e...)); res.Removed != 0 || res.Unknown != len(e) {
		t.Fatalf("remove by the forgotten pod's hashes = %+v, want all unknown", res)
	}
	// Forgetting a pod known only by its seq, or only by its mark.
	applyAt(t, s, "c", 4)
	setStale(t, s, "d", true)
	forget(t, s, "c")
	forget(t, s, "d")
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3}, store.PodInfo{Name: "b", Blocks: 2})
}

// testClearKeepsSeq checks OpClear: the pod's blocks and engine-hash map
// go, what the batch does after the clear stays, and the pod keeps its
// seq (the batch's) and stale mark.
func testClearKeepsSeq(t *testing.T, s *subject) {
	k, e := Keys(23, 8), Keys(230, 8)
	applyAt(t, s, "a", 3, pairsOp(store.TierGPU, k[:6], e[:6]), addOp(store.TierDisk, k[:2]...))
	applyAt(t, s, "b", 1, addOp(store.TierGPU, k[:3]...))
	setStale(t, s, "a", true)
	res := applyAt(t, s, "a", 4,
		addOp(store.TierCPU, k[6:]...),
		clearOp(),
		pairsOp(store.TierGPU, k[:2], e[6:]),
	)
	if res != (store.Result{AppliedSeq: 4}) {
		t.Fatalf("Apply with a clear = %+v", res)
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2, Stale: true}, store.PodInfo{Name: "b", Blocks: 3})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": stale(gpu(2)), "b": gpu(3)})
	wantMatches(t, lookup(t, s, k[6:]), map[string]store.Match{})
	wantSeq(t, s, "a", 4, true)
	wantDuplicate(t, s, "a", 4, 4, clearOp())
	// The map lost the pairs from before the clear, and has those after.
	wantEngine(t, s, "a", e, []uint64{0, 0, 0, 0, 0, 0, k[0], k[1]})
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierGPU, e[:6]...)); res.Removed != 0 || res.Unknown != 6 {
		t.Fatalf("remove by hashes from before the clear = %+v, want 6 unknown", res)
	}
	// A clear alone empties the pod, which stays known.
	apply(t, s, "a", clearOp())
	wantPods(t, s, store.PodInfo{Name: "a", Stale: true}, store.PodInfo{Name: "b", Blocks: 3})
	wantMatches(t, lookup(t, s, k, "a"), map[string]store.Match{})
	wantEngine(t, s, "a", e, make([]uint64, len(e)))
	// So does a pod cleared before it held anything.
	apply(t, s, "c", clearOp())
	wantPods(t, s, store.PodInfo{Name: "a", Stale: true}, store.PodInfo{Name: "b", Blocks: 3}, store.PodInfo{Name: "c"})
}

// testInvalidBatch checks that a batch with an invalid op anywhere changes
// nothing: no block, no seq, no engine-hash pair, no new pod.
func testInvalidBatch(t *testing.T, s *subject) {
	ctx := context.Background()
	k, e := Keys(24, 6), Keys(240, 6)
	applyAt(t, s, "a", 1, pairsOp(store.TierGPU, k[:2], e[:2]))
	valid := []store.Op{
		pairsOp(store.TierGPU, k[2:4], e[2:4]),
		removeOp(store.TierGPU, k[0]),
		engineOp(store.OpRemove, store.TierGPU, e[1]),
		store.Op{Kind: store.OpAdd, Tier: store.TierCPU, Keys: k[4:], Parent: k[3], HasParent: true},
		clearOp(),
	}
	for _, bad := range []struct {
		name string
		op   store.Op
		want error
	}{
		{"add tier", addOp(store.NumTiers, k...), store.ErrInvalidTier},
		{"remove tier 255", removeOp(255, k...), store.ErrInvalidTier},
		{"engine add tier", engineOp(store.OpAdd, store.NumTiers, e...), store.ErrInvalidTier},
		{"kind 0", store.Op{Keys: k}, store.ErrInvalidBatch},
		{"kind 99", store.Op{Kind: 99}, store.ErrInvalidBatch},
		{"engine shorter", pairsOp(store.TierGPU, k, e[:5]), store.ErrInvalidBatch},
		{"engine longer", store.Op{Kind: store.OpRemove, Keys: k[:1], Engine: e[:2]}, store.ErrInvalidBatch},
		{"clear with keys", store.Op{Kind: store.OpClear, Keys: k}, store.ErrInvalidBatch},
		{"clear with engine hashes", store.Op{Kind: store.OpClear, Engine: e}, store.ErrInvalidBatch},
	} {
		for at := 0; at <= len(valid); at++ {
			ops := slices.Insert(slices.Clone(valid), at, bad.op)
			for _, pod := range []string{"a", "new"} {
				res, err := s.Apply(ctx, pod, &store.Batch{Seq: 2, Ops: ops})
				if !errors.Is(err, bad.want) || res != (store.Result{}) {
					t.Fatalf("%s at op %d of pod %s: Apply = %+v, %v; want %v", bad.name, at, pod, res, err, bad.want)
				}
			}
		}
	}
	if _, err := s.Apply(ctx, "a", nil); !errors.Is(err, store.ErrInvalidBatch) {
		t.Fatalf("Apply(nil batch): %v, want ErrInvalidBatch", err)
	}
	wantSeq(t, s, "a", 1, true)
	wantSeq(t, s, "new", 0, false)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(2)})
	wantEngine(t, s, "a", e, []uint64{k[0], k[1], 0, 0, 0, 0})
	// The same batch, valid, applies.
	applyAt(t, s, "a", 2, valid...)
	wantPods(t, s, store.PodInfo{Name: "a"})
}

// cancelAfter is a context whose Err reports context.Canceled from its
// (after+1)th call on, and whose Done is closed then: a context canceled
// while an Apply runs.
type cancelAfter struct {
	context.Context
	after int32
	calls atomic.Int32
	once  sync.Once
	done  chan struct{}
}

func newCancelAfter(after int32) *cancelAfter {
	return &cancelAfter{Context: context.Background(), after: after, done: make(chan struct{})}
}

func (c *cancelAfter) Err() error {
	if c.calls.Add(1) > c.after {
		c.once.Do(func() { close(c.done) })
		return context.Canceled
	}
	return nil
}

func (c *cancelAfter) Done() <-chan struct{} { return c.done }

// testPartialFailure cancels an Apply at every point the store looks at
// its context: the batch applies whole, or fails with the applied seq
// where it was, and applying it again converges to the same state.
func testPartialFailure(t *testing.T, s *subject) {
	k := Keys(25, 12)
	applyAt(t, s, "a", 1, addOp(store.TierGPU, k[:4]...))
	batch := &store.Batch{Seq: 2, Ops: []store.Op{
		addOp(store.TierGPU, k[4:8]...),
		removeOp(store.TierGPU, k[0]),
		addOp(store.TierCPU, k[8:]...),
		removeOp(store.TierGPU, k[1]),
		addOp(store.TierDisk, k[1]),
	}}
	applied := false
	for after := int32(0); after < 1000 && !applied; after++ {
		res, err := s.Apply(newCancelAfter(after), "a", batch)
		switch {
		case err == nil:
			if res.Duplicate || res.AppliedSeq != 2 {
				t.Fatalf("Apply canceled after %d checks = %+v, want applied through 2", after, res)
			}
			applied = true
		case errors.Is(err, context.Canceled):
			if res.Duplicate {
				t.Fatalf("Apply canceled after %d checks = %+v, %v: a failure is no duplicate", after, res, err)
			}
			wantSeq(t, s, "a", 1, true)
		default:
			t.Fatalf("Apply canceled after %d checks: %v, want context.Canceled", after, err)
		}
	}
	if !applied {
		applyAt(t, s, "a", 2, batch.Ops...)
	}
	s.setSeq("a", 2)
	wantDuplicate(t, s, "a", 2, 2, batch.Ops...)
	wantSeq(t, s, "a", 2, true)
	wantMatches(t, lookup(t, s, k[2:]), map[string]store.Match{"a": {Blocks: 10, TierBlocks: tiers(6, 4, 0)}})
	wantMatches(t, lookup(t, s, k[1:2]), map[string]store.Match{"a": {Blocks: 1, TierBlocks: tiers(0, 0, 1)}})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 11})
}

// testEngineMap checks the engine-hash map of tokens key mode: pairs come
// with an OpAdd of keys and hashes, name blocks for OpRemove, and leave
// the map when the pod no longer holds their key.
func testEngineMap(t *testing.T, s *subject) {
	k, e := Keys(26, 8), Keys(260, 8)
	if res := apply(t, s, "a", pairsOp(store.TierGPU, k, e)); res.Unknown != 0 {
		t.Fatalf("add with engine hashes = %+v", res)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(8)})
	wantEngine(t, s, "a", e, k)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 8})

	// Removed by engine hash, with a hash never stored and one named twice.
	res := apply(t, s, "a", engineOp(store.OpRemove, store.TierGPU, e[6], e[7], 111, e[6]))
	if res.Removed != 2 || res.Unknown != 2 {
		t.Fatalf("remove by engine hash = %+v, want 2 removed, 2 unknown", res)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(6)})
	wantMatches(t, lookup(t, s, k[6:]), map[string]store.Match{})
	wantEngine(t, s, "a", e, slices.Concat(k[:6], []uint64{0, 0}))

	// Engine hashes the map does not resolve add nothing and are counted.
	if res := apply(t, s, "a", engineOp(store.OpAdd, store.TierCPU, e[7], 222)); res.Unknown != 2 || res.Removed != 0 {
		t.Fatalf("add of unknown engine hashes = %+v, want 2 unknown", res)
	}
	wantMatches(t, lookup(t, s, k[6:]), map[string]store.Match{})

	// A key removed by key takes its pair out of the map: it cannot be
	// offloaded to another tier by hash any more.
	remove(t, s, "a", store.TierGPU, k[5])
	wantEngine(t, s, "a", e[5:6], []uint64{0})
	if res := apply(t, s, "a", engineOp(store.OpAdd, store.TierCPU, e[5])); res.Unknown != 1 {
		t.Fatalf("offload of a block removed by key = %+v, want 1 unknown", res)
	}
	wantMatches(t, lookup(t, s, k[5:6]), map[string]store.Match{})

	// Another pod's map is its own, for the same keys.
	e2 := Keys(261, 3)
	apply(t, s, "b", pairsOp(store.TierGPU, k[:3], e2))
	wantEngine(t, s, "b", slices.Concat(e[:3], e2), slices.Concat([]uint64{0, 0, 0}, k[:3]))
	if res := apply(t, s, "b", engineOp(store.OpRemove, store.TierGPU, e[:3]...)); res.Removed != 0 || res.Unknown != 3 {
		t.Fatalf("b removing by a's hashes = %+v, want 3 unknown", res)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(5), "b": gpu(3)})

	// A hash stored again with another key: the later pair counts.
	apply(t, s, "a", pairsOp(store.TierGPU, Keys(262, 1), e[:1]))
	wantEngine(t, s, "a", e[:1], Keys(262, 1))
	// The pair added then removed in one batch is gone; removed then
	// added, it is back.
	apply(t, s, "a",
		pairsOp(store.TierDisk, k[7:8], e[7:8]),
		engineOp(store.OpRemove, store.TierDisk, e[7]),
		engineOp(store.OpRemove, store.TierGPU, e[4]),
		pairsOp(store.TierGPU, k[4:5], e[4:5]),
	)
	wantEngine(t, s, "a", e[4:8], []uint64{k[4], 0, 0, 0})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 6}, store.PodInfo{Name: "b", Blocks: 3})
}

// testEngineTiers checks that an engine hash names a block on one tier: a
// block held on two tiers and removed from one by engine hash stays, on
// the other and in the map, and an OpAdd by engine hash adds a tier.
func testEngineTiers(t *testing.T, s *subject) {
	k, e := Keys(27, 4), Keys(270, 4)
	apply(t, s, "a", pairsOp(store.TierGPU, k, e))
	// Offloaded to CPU, named by engine hash alone.
	if res := apply(t, s, "a", engineOp(store.OpAdd, store.TierCPU, e[:2]...)); res.Unknown != 0 {
		t.Fatalf("offload by engine hash = %+v", res)
	}
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(4)})
	// Removed from CPU: still on GPU, still in the map.
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierCPU, e[0])); res.Removed != 1 || res.Unknown != 0 {
		t.Fatalf("remove from CPU = %+v, want 1 removed", res)
	}
	wantEngine(t, s, "a", e, k)
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(4)})
	// Removed from a tier it is not on: unknown, and it stays.
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierDisk, e[0], e[1])); res.Removed != 0 || res.Unknown != 2 {
		t.Fatalf("remove from the disk tier = %+v, want 2 unknown", res)
	}
	wantEngine(t, s, "a", e, k)
	// Evicted from GPU: the CPU copy stays, and its pair.
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierGPU, e[:3]...)); res.Removed != 3 {
		t.Fatalf("remove from GPU = %+v, want 3 removed", res)
	}
	wantEngine(t, s, "a", e, []uint64{0, k[1], 0, k[3]})
	wantMatches(t, lookup(t, s, k[1:2]), map[string]store.Match{"a": {Blocks: 1, TierBlocks: tiers(0, 1, 0)}})
	wantMatches(t, lookup(t, s, k[3:]), map[string]store.Match{"a": gpu(1)})
	// The last tier gone, the pair goes.
	if res := apply(t, s, "a", engineOp(store.OpRemove, store.TierCPU, e[1])); res.Removed != 1 {
		t.Fatalf("remove from CPU = %+v, want 1 removed", res)
	}
	wantEngine(t, s, "a", e, []uint64{0, 0, 0, k[3]})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 1})
}

// testEngineKeys checks EngineKeys' shape: one answer per hash, in order,
// appended to the slices' starts, for known and unknown pods.
func testEngineKeys(t *testing.T, s *subject) {
	ctx := context.Background()
	k, e := Keys(28, 3), Keys(280, 3)
	apply(t, s, "a", pairsOp(store.TierGPU, k, e))
	hashes := []uint64{e[2], 5, e[0], e[2]}
	junkKeys := []uint64{9, 9, 9, 9, 9, 9}
	junkFound := []bool{true, true, true, true, true, true}
	keys, found, err := s.EngineKeys(ctx, "a", hashes, junkKeys, junkFound)
	if err != nil || !slices.Equal(found, []bool{true, false, true, true}) || keys[0] != k[2] || keys[2] != k[0] || keys[3] != k[2] {
		t.Fatalf("EngineKeys = %#x, %v, %v", keys, found, err)
	}
	for _, pod := range []string{"nope", "a"} {
		keys, found, err = s.EngineKeys(ctx, pod, nil, junkKeys, junkFound)
		if err != nil || len(keys) != 0 || len(found) != 0 {
			t.Fatalf("EngineKeys(%s, no hashes) = %v, %v, %v", pod, keys, found, err)
		}
	}
	keys, found, err = s.EngineKeys(ctx, "nope", e, junkKeys, junkFound)
	if err != nil || !slices.Equal(found, []bool{false, false, false}) || len(keys) != 3 {
		t.Fatalf("EngineKeys(unknown pod) = %v, %v, %v", keys, found, err)
	}
	// Reading the map changes nothing.
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 3})
}

// testStale checks the stale mark as Pods and Lookup report it.
func testStale(t *testing.T, s *subject) {
	k := Keys(29, 4)
	setStale(t, s, "a", false) // an unknown pod marked consistent stays unknown
	wantPods(t, s)
	setStale(t, s, "a", true)
	setStale(t, s, "a", true)
	wantPods(t, s, store.PodInfo{Name: "a", Stale: true})
	add(t, s, "a", store.TierGPU, k...)
	add(t, s, "b", store.TierGPU, k[:2]...)
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": stale(gpu(4)), "b": gpu(2)})
	wantMatches(t, lookup(t, s, k, "a"), map[string]store.Match{"a": stale(gpu(4))})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 4, Stale: true}, store.PodInfo{Name: "b", Blocks: 2})
	setStale(t, s, "a", false)
	setStale(t, s, "b", true)
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(4), "b": stale(gpu(2))})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 4}, store.PodInfo{Name: "b", Blocks: 2, Stale: true})
	// Marked and unmarked before it held anything: not known.
	setStale(t, s, "c", true)
	setStale(t, s, "c", false)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 4}, store.PodInfo{Name: "b", Blocks: 2, Stale: true})
	// Forgotten, a pod loses its mark.
	forget(t, s, "b")
	add(t, s, "b", store.TierGPU, k[:1]...)
	wantMatches(t, lookup(t, s, k), map[string]store.Match{"a": gpu(4), "b": gpu(1)})
}

// testPodsState checks that Pods lists a pod for each thing the store
// keeps of it: blocks, an applied seq, a stale mark.
func testPodsState(t *testing.T, s *subject) {
	apply(t, s, "seq-only")
	apply(t, s, "removed-only", removeOp(store.TierGPU, Keys(30, 2)...))
	apply(t, s, "emptied", addOp(store.TierGPU, Keys(31, 2)...), removeOp(store.TierGPU, Keys(31, 2)...))
	setStale(t, s, "stale-only", true)
	add(t, s, "blocks", store.TierCPU, Keys(32, 3)...)
	setStale(t, s, "blocks", true)
	wantPods(t, s,
		store.PodInfo{Name: "blocks", Blocks: 3, Stale: true},
		store.PodInfo{Name: "emptied"},
		store.PodInfo{Name: "removed-only"},
		store.PodInfo{Name: "seq-only"},
		store.PodInfo{Name: "stale-only", Stale: true},
	)
	// A stale mark lifted from a pod that has a seq leaves it known.
	setStale(t, s, "blocks", false)
	setStale(t, s, "seq-only", false)
	setStale(t, s, "stale-only", false)
	wantPods(t, s,
		store.PodInfo{Name: "blocks", Blocks: 3},
		store.PodInfo{Name: "emptied"},
		store.PodInfo{Name: "removed-only"},
		store.PodInfo{Name: "seq-only"},
	)
}

func wantModels(t testing.TB, s store.Store, want map[string]store.ModelState) {
	t.Helper()
	got, err := s.Models(context.Background())
	if err != nil {
		t.Fatalf("Models: %v", err)
	}
	eq := func(a, b store.ModelState) bool {
		return a.KeyMode == b.KeyMode && slices.Equal(slices.Sorted(slices.Values(a.LoRAs)), slices.Sorted(slices.Values(b.LoRAs)))
	}
	if !maps.EqualFunc(got, want, eq) {
		t.Fatalf("Models:\n got %+v\nwant %+v", got, want)
	}
}

// testModelState checks the model state: the first key mode decided
// wins, the first base an adapter is taught wins, and Models lists every
// model either made known.
func testModelState(t *testing.T, s *subject) {
	ctx := context.Background()
	wantModels(t, s, map[string]store.ModelState{})
	decide := func(model, mode, want string) {
		t.Helper()
		if got, err := s.DecideKeyMode(ctx, model, mode); err != nil || got != want {
			t.Fatalf("DecideKeyMode(%q, %q) = %q, %v; want %q", model, mode, got, err, want)
		}
	}
	lora := func(adapter, base, want string) {
		t.Helper()
		if got, err := s.AddLoRA(ctx, adapter, base); err != nil || got != want {
			t.Fatalf("AddLoRA(%q, %q) = %q, %v; want %q", adapter, base, got, err, want)
		}
	}
	decide("m1", store.KeyModeTokens, store.KeyModeTokens)
	decide("m1", store.KeyModeEngine, store.KeyModeTokens)
	decide("m1", store.KeyModeTokens, store.KeyModeTokens)
	decide("m2", store.KeyModeEngine, store.KeyModeEngine)
	lora("l1", "m1", "m1")
	lora("l1", "m3", "m1")
	lora("l1", "m1", "m1")
	lora("l2", "m3", "m3")
	lora("l0", "m1", "m1")
	want := map[string]store.ModelState{
		"m1": {KeyMode: store.KeyModeTokens, LoRAs: []string{"l0", "l1"}},
		"m2": {KeyMode: store.KeyModeEngine},
		"m3": {LoRAs: []string{"l2"}},
	}
	wantModels(t, s, want)
	// A model taught adapters first is decided like any other.
	decide("m3", store.KeyModeEngine, store.KeyModeEngine)
	want["m3"] = store.ModelState{KeyMode: store.KeyModeEngine, LoRAs: []string{"l2"}}
	wantModels(t, s, want)
	// What Models returns is the caller's.
	got, err := s.Models(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got["m1"].LoRAs[0] = "changed"
	delete(got, "m2")
	wantModels(t, s, want)
	// Refused input changes nothing.
	if _, err := s.DecideKeyMode(ctx, "m4", "auto"); !errors.Is(err, store.ErrInvalidName) {
		t.Fatalf("DecideKeyMode(m4, auto): %v, want ErrInvalidName", err)
	}
	if _, err := s.AddLoRA(ctx, "l3", ""); !errors.Is(err, store.ErrInvalidName) {
		t.Fatalf("AddLoRA(l3, \"\"): %v, want ErrInvalidName", err)
	}
	wantModels(t, s, want)
	// Model state is apart from pods.
	wantPods(t, s)
}

// testConcurrent runs writers, readers and everything else at once; run
// it with the race detector. Each writer owns a pod and checks every
// answer about it exactly; readers check what holds whatever the
// interleaving; churners apply to, forget and mark shared pods with no
// order between them; deciders race to decide the same models. The final
// state is checked once everyone is done.
func testConcurrent(t *testing.T, s *subject) {
	const (
		writers  = 4
		readers  = 3
		churners = 2
		deciders = 3
		rounds   = 60
		private  = 48
	)
	shared := Keys(18, 16)
	chains := make([][]uint64, writers)
	hashes := make([][]uint64, writers)
	names := make([]string, writers)
	for w := range chains {
		chains[w] = slices.Concat(shared, Keys(uint64(180+w), private))
		hashes[w] = Keys(uint64(1800+w), len(chains[w]))
		names[w] = fmt.Sprintf("w%d", w)
	}
	churned := []string{"c0", "c1"}
	churnKeys := Keys(189, 32)
	known := func(pod string) bool { return slices.Contains(names, pod) || slices.Contains(churned, pod) }
	owner := func(pod string) int { return slices.Index(names, pod) }
	ctx := context.Background()

	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			name, chain, eng := names[w], chains[w], hashes[w]
			var seq uint64
			held := map[int]uint8{} // chain index -> tier mask, as the writer knows it
			fail := func(format string, args ...any) {
				t.Errorf("writer %d round %d: "+format, append([]any{w, seq}, args...)...)
			}
			for r := range rounds {
				seq++
				var ops []store.Op
				if r%15 == 14 {
					ops = append(ops, clearOp())
					clear(held)
				}
				tier := store.Tier(rng.IntN(int(store.NumTiers)))
				n := rng.IntN(len(chain)) + 1
				ops = append(ops, pairsOp(tier, chain[:n], eng[:n]))
				for i := range n {
					held[i] |= 1 << tier
				}
				from := rng.IntN(len(chain))
				rt := store.Tier(rng.IntN(int(store.NumTiers)))
				wantRemoved := 0
				for i := from; i < len(chain); i++ {
					if held[i]&(1<<rt) != 0 {
						wantRemoved++
						if held[i] &^= 1 << rt; held[i] == 0 {
							delete(held, i)
						}
					}
				}
				if r%2 == 0 {
					ops = append(ops, engineOp(store.OpRemove, rt, eng[from:]...))
				} else {
					ops = append(ops, removeOp(rt, chain[from:]...))
				}
				res, err := s.Apply(ctx, name, &store.Batch{Seq: seq, Ops: ops})
				if err != nil {
					fail("Apply: %v", err)
					return
				}
				if res.Duplicate || res.AppliedSeq != seq || res.Removed != wantRemoved || res.Removed+res.Unknown != len(chain)-from {
					fail("Apply = %+v, want applied with %d of %d removed", res, wantRemoved, len(chain)-from)
					return
				}
				if r%7 == 3 {
					res, err := s.Apply(ctx, name, &store.Batch{Seq: seq - uint64(rng.IntN(2)), Ops: []store.Op{clearOp()}})
					if err != nil || res != (store.Result{Duplicate: true, AppliedSeq: seq}) {
						fail("Apply of a duplicate = %+v, %v", res, err)
						return
					}
				}
				keys, found, err := s.EngineKeys(ctx, name, eng, nil, nil)
				if err != nil {
					fail("EngineKeys: %v", err)
					return
				}
				for i := range eng {
					if _, ok := held[i]; found[i] != ok || ok && keys[i] != chain[i] {
						fail("EngineKeys: hash %d = %#x, %v; want held %v", i, keys[i], found[i], ok)
						return
					}
				}
				if err := s.SetStale(ctx, name, r%3 == 0); err != nil {
					fail("SetStale: %v", err)
					return
				}
				if r%20 == 19 {
					if err := s.ForgetPod(ctx, name); err != nil {
						fail("ForgetPod: %v", err)
						return
					}
					seq = 0 // a new pod: seq 1 applies
					clear(held)
				}
			}
		}()
	}
	for c := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 3))
			for i := range rounds {
				pod := churned[rng.IntN(len(churned))]
				var err error
				switch rng.IntN(4) {
				case 0:
					err = s.ForgetPod(ctx, pod)
				case 1:
					err = s.SetStale(ctx, pod, rng.IntN(2) == 0)
				default:
					// Seqs race with the other churner's: some batches are
					// duplicates, which is fine.
					from := rng.IntN(len(churnKeys))
					_, err = s.Apply(ctx, pod, &store.Batch{Seq: uint64(i + rng.IntN(3)), Ops: []store.Op{
						addOp(store.Tier(rng.IntN(int(store.NumTiers))), churnKeys[:from+1]...),
						removeOp(store.TierGPU, churnKeys[from:]...),
					}})
				}
				if err != nil {
					t.Errorf("churner %d: %v", c, err)
					return
				}
			}
		}()
	}
	decided := make([][]string, deciders) // by decider: modes, then bases
	for d := range deciders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			modes := []string{store.KeyModeEngine, store.KeyModeTokens}
			for i := range 20 {
				mode, err := s.DecideKeyMode(ctx, fmt.Sprintf("m%d", i%5), modes[(d+i)%2])
				if err != nil {
					t.Errorf("decider %d: DecideKeyMode: %v", d, err)
					return
				}
				base, err := s.AddLoRA(ctx, fmt.Sprintf("l%d", i%7), fmt.Sprintf("m%d", d))
				if err != nil {
					t.Errorf("decider %d: AddLoRA: %v", d, err)
					return
				}
				decided[d] = append(decided[d], mode, base)
			}
		}()
	}
	var rwg sync.WaitGroup
	for r := range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			var (
				out   []store.Match
				keys  []uint64
				found []bool
			)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				w := rng.IntN(writers)
				var filter []string
				if r%2 == 1 {
					filter = []string{names[w], names[(w+1)%writers], "nope", churned[0]}
				}
				var err error
				out, err = s.Lookup(ctx, chains[w], filter, out)
				if err != nil {
					t.Errorf("reader %d: Lookup: %v", r, err)
					return
				}
				for _, m := range out {
					o := owner(m.Pod)
					sum := 0
					for _, n := range m.TierBlocks {
						sum += n
					}
					switch {
					case o < 0:
						t.Errorf("reader %d: match for unknown pod %+v", r, m)
					case m.Blocks < 1 || m.Blocks > len(chains[w]) || sum != m.Blocks:
						t.Errorf("reader %d: bad match %+v for a query of %d keys", r, m, len(chains[w]))
					case o != w && m.Blocks > len(shared):
						t.Errorf("reader %d: pod %s matched %d blocks of %s's chain, which shares only %d", r, m.Pod, m.Blocks, names[w], len(shared))
					case filter != nil && o != w && o != (w+1)%writers:
						t.Errorf("reader %d: pod %s is not in the filter %q", r, m.Pod, filter)
					}
				}
				if keys, found, err = s.EngineKeys(ctx, names[w], hashes[w], keys, found); err != nil || len(keys) != len(hashes[w]) || len(found) != len(keys) {
					t.Errorf("reader %d: EngineKeys = %d keys, %d found, %v", r, len(keys), len(found), err)
					return
				}
				for j := range keys {
					if found[j] && keys[j] != chains[w][j] {
						t.Errorf("reader %d: EngineKeys(%s): hash %d resolved to %#x, want %#x", r, names[w], j, keys[j], chains[w][j])
					}
				}
				if _, _, err := s.AppliedSeq(ctx, names[w]); err != nil {
					t.Errorf("reader %d: AppliedSeq: %v", r, err)
					return
				}
				if i%16 == 0 {
					ps, err := s.Pods(ctx)
					if err != nil {
						t.Errorf("reader %d: Pods: %v", r, err)
						return
					}
					for _, p := range ps {
						if !known(p.Name) || p.Blocks < 1 && p.Evicted == 0 && !p.HasSeq && !p.Stale || p.Blocks > len(shared)+private {
							t.Errorf("reader %d: Pods: bad %+v", r, p)
						}
					}
					if _, err := s.Models(ctx); err != nil {
						t.Errorf("reader %d: Models: %v", r, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	rwg.Wait()
	if t.Failed() {
		return
	}

	// The deciders agree with each other and with Models.
	models, err := s.Models(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for d := range deciders {
		for i := range 20 {
			mode, base := decided[d][2*i], decided[d][2*i+1]
			model, adapter := fmt.Sprintf("m%d", i%5), fmt.Sprintf("l%d", i%7)
			if models[model].KeyMode != mode {
				t.Fatalf("decider %d was told %s's mode is %q; Models says %+v", d, model, mode, models[model])
			}
			if !slices.Contains(models[base].LoRAs, adapter) {
				t.Fatalf("decider %d was told %s's base is %s; Models says %+v", d, adapter, base, models)
			}
		}
	}

	// Settle into a known state and check it exactly.
	for _, pod := range slices.Concat(names, churned) {
		forget(t, s, pod)
	}
	for w := range writers {
		add(t, s, names[w], store.TierGPU, chains[w]...)
	}
	var want []store.PodInfo
	for w := range writers {
		want = append(want, store.PodInfo{Name: names[w], Blocks: len(chains[w])})
	}
	wantPods(t, s, want...)
	for w := range writers {
		wantMatch := map[string]store.Match{}
		for o := range writers {
			wantMatch[names[o]] = gpu(len(shared))
		}
		wantMatch[names[w]] = gpu(len(chains[w]))
		wantMatches(t, lookup(t, s, chains[w]), wantMatch)
	}
}

// testCapacity fills a Bounded store to three times its capacity, with
// some blocks held by many pods, and checks that it never holds more.
func testCapacity(t *testing.T, s *subject) {
	b, ok := s.Store.(Bounded)
	if !ok {
		t.Skip("store has no capacity")
	}
	c := b.CapacityBlocks()
	if c > MaxBoundedCapacity {
		t.Skipf("capacity %d is too large to fill here (at most %d)", c, MaxBoundedCapacity)
	}
	total := func() int {
		n := 0
		for _, p := range pods(t, s) {
			n += p.Blocks
		}
		return n
	}
	shared := Keys(19, 8)
	const batch = 64
	for i := 0; i*batch < 3*c; i++ {
		pod := fmt.Sprintf("p%d", i%7)
		add(t, s, pod, store.Tier(i%int(store.NumTiers)), Keys(uint64(1<<20+i), batch)...)
		if i%5 == 0 {
			add(t, s, pod, store.TierGPU, shared...)
		}
		if i%16 == 0 {
			if n := total(); n > c {
				t.Fatalf("after %d batches the store holds %d blocks, capacity %d", i+1, n, c)
			}
		}
	}
	n := total()
	if n > c {
		t.Fatalf("the store holds %d blocks, capacity %d", n, c)
	}
	if n == 0 {
		t.Fatalf("the store holds nothing after adding %d blocks with capacity %d", 3*c, c)
	}
	// What was added last and what is still counted can be looked up.
	last := Keys(uint64(1<<20+(3*c-1)/batch), batch)
	for _, m := range lookup(t, s, last) {
		if m.Blocks > batch {
			t.Fatalf("Lookup of the last batch: %+v", m)
		}
	}
}

// testFairShare fills a Bounded store with a few pods that stay well
// within their share of it, then floods it with one pod that adds three
// times its capacity. The flood must cost the flooding pod alone: the
// others' lookups are unchanged and complete, and a block they add
// afterwards is kept, while the flooding pod's matches are Incomplete and
// Pods counts its evictions until it is cleared.
func testFairShare(t *testing.T, s *subject) {
	b, ok := s.Store.(Bounded)
	if !ok {
		t.Skip("store has no capacity")
	}
	c := b.CapacityBlocks()
	if c > MaxBoundedCapacity {
		t.Skipf("capacity %d is too large to fill here (at most %d)", c, MaxBoundedCapacity)
	}
	const batch = 64
	// Three pods with an eighth of the capacity each, when the four pods'
	// fair share is a quarter.
	honest := []string{"honest-0", "honest-1", "honest-2"}
	per := c / 8 / batch
	if per == 0 {
		t.Skipf("capacity %d is too small for prompts of %d blocks", c, batch)
	}
	prompt := func(pod, i int) []uint64 { return Keys(uint64(1<<21+pod<<12+i), batch) }
	for i := range per {
		for p, pod := range honest {
			add(t, s, pod, store.TierGPU, prompt(p, i)...)
		}
	}
	checkHonest := func(when string, extra int) {
		t.Helper()
		for p, pod := range honest {
			for i := range per + extra {
				got := lookup(t, s, prompt(p, i), pod)
				if m := got[pod]; m != gpu(batch) {
					t.Fatalf("%s: lookup of %s's prompt %d = %+v, want all %d blocks, complete", when, pod, i, m, batch)
				}
			}
			extra = 0 // only the first pod added more
		}
	}
	checkHonest("before the flood", 0)

	const greedy = "greedy"
	floods := 3 * c / batch
	for i := range floods {
		add(t, s, greedy, store.TierGPU, Keys(uint64(1<<22+i), batch)...)
	}
	checkHonest("after the flood", 0)
	last := lookup(t, s, Keys(uint64(1<<22+floods-1), batch), greedy)
	if m, ok := last[greedy]; !ok || !m.Incomplete {
		t.Fatalf("lookup of the flooding pod's last blocks = %+v, want a match marked Incomplete", last)
	}
	total := 0
	var info *store.PodInfo
	for _, p := range pods(t, s) {
		total += p.Blocks
		switch {
		case p.Name == greedy:
			info = &p
		case p.Blocks != per*batch || p.Evicted != 0:
			t.Fatalf("Pods: %+v, want %d blocks and none evicted", p, per*batch)
		}
	}
	if total > c {
		t.Fatalf("the store holds %d blocks, capacity %d", total, c)
	}
	if info == nil || info.Evicted == 0 {
		t.Fatalf("Pods: flooding pod %+v, want evictions counted", info)
	}

	// A pod within its share adds more: the flooding pod makes room.
	add(t, s, honest[0], store.TierGPU, prompt(0, per)...)
	checkHonest("after adding more", 1)

	// Clearing the flooding pod resets its count; it stays known.
	apply(t, s, greedy, clearOp())
	seq, _ := s.seq(greedy)
	for _, p := range pods(t, s) {
		if p.Name == greedy && p != (store.PodInfo{Name: greedy, AppliedSeq: seq, HasSeq: true}) {
			t.Fatalf("Pods after a clear lists %+v, want no blocks and none evicted", p)
		}
	}
	again := Keys(uint64(1<<23), 4)
	add(t, s, greedy, store.TierGPU, again...)
	wantMatches(t, lookup(t, s, again, greedy), map[string]store.Match{greedy: gpu(4)})
	for _, p := range pods(t, s) {
		if p.Name == greedy && (p.Blocks != 4 || p.Evicted != 0) {
			t.Fatalf("Pods after a clear and an add of 4 blocks: %+v, want 4 blocks, none evicted", p)
		}
	}
	// So does forgetting it.
	forget(t, s, greedy)
	for _, p := range pods(t, s) {
		if p.Name == greedy {
			t.Fatalf("Pods after ForgetPod lists %+v", p)
		}
	}
}
