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
		f    func(t *testing.T, s store.Store)
	}{
		{"EmptyQuery", testEmptyQuery},
		{"EmptyStore", testEmptyStore},
		{"Chain", testChain},
		{"AddAfter", testAddAfter},
		{"MissInMiddle", testMissInMiddle},
		{"FirstKeyMissing", testFirstKeyMissing},
		{"PodFilter", testPodFilter},
		{"ExtremeKeys", testExtremeKeys},
		{"Idempotent", testIdempotent},
		{"RemoveUnknown", testRemoveUnknown},
		{"RemoveLastBlock", testRemoveLastBlock},
		{"Tiers", testTiers},
		{"ClearPod", testClearPod},
		{"PodsCounts", testPodsCounts},
		{"ManyHolders", testManyHolders},
		{"LongQuery", testLongQuery},
		{"OutReuse", testOutReuse},
		{"InvalidInput", testInvalidInput},
		{"CanceledContext", testCanceledContext},
		{"Concurrent", testConcurrent},
		{"Capacity", testCapacity},
		{"FairShare", testFairShare},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.f(t, newStore(t)) })
	}
}

// Keys returns n distinct pseudo-random keys for seed, spread over all 64
// bits like engine hashes.
func Keys(seed uint64, n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = splitmix(seed<<32 + uint64(i))
	}
	return ks
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// tiers builds a TierBlocks value.
func tiers(gpu, cpu, disk int) [store.NumTiers]int { return [store.NumTiers]int{gpu, cpu, disk} }

func gpu(n int) store.Match { return store.Match{Blocks: n, TierBlocks: tiers(n, 0, 0)} }

func add(t testing.TB, s store.Store, pod string, tier store.Tier, keys ...uint64) {
	t.Helper()
	if err := s.Add(context.Background(), pod, tier, keys); err != nil {
		t.Fatalf("Add(%q, %v, %d keys): %v", pod, tier, len(keys), err)
	}
}

func remove(t testing.TB, s store.Store, pod string, tier store.Tier, keys ...uint64) int {
	t.Helper()
	n, err := s.Remove(context.Background(), pod, tier, keys)
	if err != nil {
		t.Fatalf("Remove(%q, %v, %d keys): %v", pod, tier, len(keys), err)
	}
	return n
}

func clearPod(t testing.TB, s store.Store, pod string) {
	t.Helper()
	if err := s.ClearPod(context.Background(), pod); err != nil {
		t.Fatalf("ClearPod(%q): %v", pod, err)
	}
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

func wantPods(t testing.TB, s store.Store, want ...store.PodInfo) {
	t.Helper()
	got := pods(t, s)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Pods:\n got %+v\nwant %+v", got, want)
	}
}

func testEmptyQuery(t *testing.T, s store.Store) {
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

func testEmptyStore(t *testing.T, s store.Store) {
	keys := Keys(2, 8)
	wantMatches(t, lookup(t, s, keys), map[string]store.Match{})
	wantMatches(t, lookup(t, s, keys, "a"), map[string]store.Match{})
	wantPods(t, s)
	if n := remove(t, s, "a", store.TierGPU, keys...); n != 0 {
		t.Fatalf("Remove on an empty store = %d, want 0", n)
	}
	clearPod(t, s, "a")
	wantPods(t, s)
}

func testChain(t *testing.T, s store.Store) {
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

// testAddAfter checks that a store.Chainer's AddAfter gives Add's results
// whatever the parent: held by the pod, by another pod, by none, or a
// block in the middle of a chain. Stores that are not Chainers skip it.
func testAddAfter(t *testing.T, s store.Store) {
	c, ok := s.(store.Chainer)
	if !ok {
		t.Skip("not a store.Chainer")
	}
	chain := Keys(30, 40)
	after := func(pod string, parent uint64, keys ...uint64) {
		t.Helper()
		if err := c.AddAfter(context.Background(), pod, store.TierGPU, parent, keys); err != nil {
			t.Fatalf("AddAfter(%s): %v", pod, err)
		}
	}
	add(t, s, "a", store.TierGPU, chain[:4]...)
	after("a", chain[3], chain[4:8]...)
	// Decoding: one block at a time.
	for i := 8; i < 20; i++ {
		after("a", chain[i-1], chain[i])
	}
	after("b", chain[19], chain[20:24]...) // a parent b does not hold
	after("a", Keys(31, 1)[0], chain[24:26]...)
	after("a", chain[1], chain[26:30]...) // a parent whose successors are taken
	after("a", chain[5], chain[5:8]...)   // keys already held
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(20)})
	wantMatches(t, lookup(t, s, chain[20:]), map[string]store.Match{"b": gpu(4)})
	wantMatches(t, lookup(t, s, chain[24:30]), map[string]store.Match{"a": gpu(6)})
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 26}, store.PodInfo{Name: "b", Blocks: 4})
	// Removal and re-adding after a parent keep the answers right.
	remove(t, s, "a", store.TierGPU, chain[10:12]...)
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(10)})
	after("a", chain[9], chain[10:12]...)
	wantMatches(t, lookup(t, s, chain[:20]), map[string]store.Match{"a": gpu(20)})
}

func testMissInMiddle(t *testing.T, s store.Store) {
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

func testFirstKeyMissing(t *testing.T, s store.Store) {
	chain := Keys(5, 10)
	add(t, s, "a", store.TierGPU, chain[1:]...)
	add(t, s, "b", store.TierGPU, chain[0])
	add(t, s, "b", store.TierGPU, chain[2:]...)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"b": gpu(1)})
	wantMatches(t, lookup(t, s, chain, "a"), map[string]store.Match{})
}

func testPodFilter(t *testing.T, s store.Store) {
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
}

func testExtremeKeys(t *testing.T, s store.Store) {
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
}

func testIdempotent(t *testing.T, s store.Store) {
	chain := Keys(7, 8)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierGPU, chain[2], chain[2], chain[3])
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 8})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": gpu(8)})
	// The same key twice in one Remove is removed once.
	if n := remove(t, s, "a", store.TierGPU, chain[7], chain[7], chain[6]); n != 2 {
		t.Fatalf("Remove(k7, k7, k6) = %d, want 2", n)
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 6})
	// A query may repeat a key.
	q := []uint64{chain[0], chain[0], chain[1], chain[0]}
	wantMatches(t, lookup(t, s, q), map[string]store.Match{"a": gpu(4)})
}

func testRemoveUnknown(t *testing.T, s store.Store) {
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
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 4})
}

func testRemoveLastBlock(t *testing.T, s store.Store) {
	k := Keys(9, 1)
	add(t, s, "a", store.TierCPU, k...)
	add(t, s, "b", store.TierGPU, Keys(90, 2)...)
	if n := remove(t, s, "a", store.TierCPU, k...); n != 1 {
		t.Fatalf("Remove = %d, want 1", n)
	}
	wantPods(t, s, store.PodInfo{Name: "b", Blocks: 2})
	wantMatches(t, lookup(t, s, k), map[string]store.Match{})
	add(t, s, "a", store.TierGPU, k...)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 1}, store.PodInfo{Name: "b", Blocks: 2})
}

func testTiers(t *testing.T, s store.Store) {
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

func testClearPod(t *testing.T, s store.Store) {
	chain := Keys(11, 10)
	add(t, s, "a", store.TierGPU, chain...)
	add(t, s, "a", store.TierCPU, chain[:3]...)
	add(t, s, "a", store.TierGPU, Keys(110, 50)...)
	add(t, s, "b", store.TierGPU, chain[:6]...)
	clearPod(t, s, "a")
	wantPods(t, s, store.PodInfo{Name: "b", Blocks: 6})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"b": gpu(6)})
	wantMatches(t, lookup(t, s, chain, "a"), map[string]store.Match{})
	if n := remove(t, s, "a", store.TierGPU, chain...); n != 0 {
		t.Fatalf("Remove after ClearPod = %d, want 0", n)
	}
	clearPod(t, s, "a")
	clearPod(t, s, "nope")

	// A cleared pod starts again from nothing.
	add(t, s, "a", store.TierCPU, chain[:2]...)
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2}, store.PodInfo{Name: "b", Blocks: 6})
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{"a": {Blocks: 2, TierBlocks: tiers(0, 2, 0)}, "b": gpu(6)})

	clearPod(t, s, "b")
	clearPod(t, s, "a")
	wantPods(t, s)
	wantMatches(t, lookup(t, s, chain), map[string]store.Match{})
}

func testPodsCounts(t *testing.T, s store.Store) {
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

func testManyHolders(t *testing.T, s store.Store) {
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
		clearPod(t, s, names[i])
	}
	wantMatches(t, lookup(t, s, shared[:1]), map[string]store.Match{})
	var wantInfo []store.PodInfo
	for i := 4; i < n-1; i++ {
		wantInfo = append(wantInfo, store.PodInfo{Name: names[i], Blocks: 7 - (i+1)%2 + i%5})
	}
	wantPods(t, s, wantInfo...)
}

func testLongQuery(t *testing.T, s store.Store) {
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

func testOutReuse(t *testing.T, s store.Store) {
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

func testInvalidInput(t *testing.T, s store.Store) {
	ctx := context.Background()
	keys := Keys(16, 2)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"Add empty pod", s.Add(ctx, "", store.TierGPU, keys), store.ErrInvalidPod},
		{"Add bad tier", s.Add(ctx, "a", store.NumTiers, keys), store.ErrInvalidTier},
		{"Add tier 255", s.Add(ctx, "a", 255, keys), store.ErrInvalidTier},
		{"Remove empty pod", second(s.Remove(ctx, "", store.TierGPU, keys)), store.ErrInvalidPod},
		{"Remove bad tier", second(s.Remove(ctx, "a", store.NumTiers, keys)), store.ErrInvalidTier},
		{"ClearPod empty pod", s.ClearPod(ctx, ""), store.ErrInvalidPod},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	wantPods(t, s)
}

func second(_ int, err error) error { return err }

func testCanceledContext(t *testing.T, s store.Store) {
	keys := Keys(17, 2)
	add(t, s, "a", store.TierGPU, keys...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, lerr := s.Lookup(ctx, keys, nil, nil)
	_, perr := s.Pods(ctx)
	for name, err := range map[string]error{
		"Add":      s.Add(ctx, "a", store.TierGPU, Keys(170, 1)),
		"Remove":   second(s.Remove(ctx, "a", store.TierGPU, keys)),
		"ClearPod": s.ClearPod(ctx, "a"),
		"Lookup":   lerr,
		"Pods":     perr,
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: error %v, want context.Canceled", name, err)
		}
	}
	wantPods(t, s, store.PodInfo{Name: "a", Blocks: 2})
}

// testConcurrent runs writers, readers and clears at once; run it with the
// race detector. Readers check what holds whatever the interleaving; the
// final state is checked once everyone is done.
func testConcurrent(t *testing.T, s store.Store) {
	const (
		writers = 4
		readers = 4
		rounds  = 60
		private = 48
	)
	shared := Keys(18, 16)
	chains := make([][]uint64, writers)
	names := make([]string, writers)
	for w := range chains {
		chains[w] = slices.Concat(shared, Keys(uint64(180+w), private))
		names[w] = fmt.Sprintf("w%d", w)
	}
	owner := func(pod string) int { return slices.Index(names, pod) }
	ctx := context.Background()

	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			chain := chains[w]
			for r := range rounds {
				tier := store.Tier(rng.IntN(int(store.NumTiers)))
				n := rng.IntN(len(chain)) + 1
				if err := s.Add(ctx, names[w], tier, chain[:n]); err != nil {
					t.Errorf("writer %d: Add: %v", w, err)
					return
				}
				from := rng.IntN(len(chain))
				if _, err := s.Remove(ctx, names[w], store.Tier(rng.IntN(int(store.NumTiers))), chain[from:]); err != nil {
					t.Errorf("writer %d: Remove: %v", w, err)
					return
				}
				if r%15 == 14 {
					if err := s.ClearPod(ctx, names[w]); err != nil {
						t.Errorf("writer %d: ClearPod: %v", w, err)
						return
					}
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for r := range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			var out []store.Match
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				w := rng.IntN(writers)
				var filter []string
				if r%2 == 1 {
					filter = []string{names[w], names[(w+1)%writers], "nope"}
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
				if i%16 == 0 {
					ps, err := s.Pods(ctx)
					if err != nil {
						t.Errorf("reader %d: Pods: %v", r, err)
						return
					}
					for _, p := range ps {
						if owner(p.Name) < 0 || p.Blocks < 1 && p.Evicted == 0 || p.Blocks > len(shared)+private {
							t.Errorf("reader %d: Pods: bad %+v", r, p)
						}
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

	// Settle into a known state and check it exactly.
	for w := range writers {
		clearPod(t, s, names[w])
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
func testCapacity(t *testing.T, s store.Store) {
	b, ok := s.(Bounded)
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
func testFairShare(t *testing.T, s store.Store) {
	b, ok := s.(Bounded)
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

	// Clearing the flooding pod resets its count.
	clearPod(t, s, greedy)
	for _, p := range pods(t, s) {
		if p.Name == greedy {
			t.Fatalf("Pods after ClearPod lists %+v", p)
		}
	}
	again := Keys(uint64(1<<23), 4)
	add(t, s, greedy, store.TierGPU, again...)
	wantMatches(t, lookup(t, s, again, greedy), map[string]store.Match{greedy: gpu(4)})
	for _, p := range pods(t, s) {
		if p.Name == greedy && (p.Blocks != 4 || p.Evicted != 0) {
			t.Fatalf("Pods after ClearPod and an Add of 4 blocks: %+v, want 4 blocks, none evicted", p)
		}
	}
}
