package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/redis"
	"github.com/prefixd/prefixd/store/storetest"
	"github.com/prefixd/prefixd/testutil/redistest"
)

func TestMain(m *testing.M) {
	// go-redis logs failed dials through a logger of its own; the tests
	// that kill servers make many.
	goredis.SetLogger(&logging.VoidLogger{})
	goleak.VerifyTestMain(m)
}

var prefixes atomic.Int64

// freshPrefix returns a key prefix no other store of the test process
// uses, so that stores of one test share a server and nothing else.
func freshPrefix() string { return fmt.Sprintf("t%d:", prefixes.Add(1)) }

// newStore returns a store on url (with a prefix of its own unless o has
// one), closed when the test ends.
func newStore(t testing.TB, url string, o redis.Options) *redis.Store {
	t.Helper()
	o.URL = url
	if o.Prefix == "" {
		o.Prefix = freshPrefix()
	}
	s, err := redis.New(context.Background(), o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// TestSingle runs the conformance suite and the Redis store's own tests
// against one redis-server, each subtest (and each conformance subtest)
// with a prefix of its own.
func TestSingle(t *testing.T) {
	runAll(t, redistest.Server(t))
}

// TestCluster runs them against a Redis Cluster of 3 masters.
func TestCluster(t *testing.T) {
	runAll(t, redistest.Cluster(t))
}

func runAll(t *testing.T, url string) {
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, url, redis.Options{}) })
	})
	for _, tc := range []struct {
		name string
		f    func(t *testing.T, url string)
	}{
		{"Lease", testLease},
		{"LeaseForget", testLeaseForget},
		{"BlockTTL", testBlockTTL},
		{"ForgetChunks", testForgetChunks},
		{"SharedIndex", testSharedIndex},
		{"Ping", testPing},
		{"EngineMapBound", testEngineMapBound},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, url) })
	}
}

func batch(seq uint64, ops ...store.Op) *store.Batch { return &store.Batch{Seq: seq, Ops: ops} }

func addOp(keys ...uint64) store.Op {
	return store.Op{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys}
}

func mustApply(t *testing.T, s store.Store, pod string, b *store.Batch) store.Result {
	t.Helper()
	res, err := s.Apply(context.Background(), pod, b)
	if err != nil || res.Duplicate || res.AppliedSeq != b.Seq {
		t.Fatalf("Apply(%s, seq %d) = %+v, %v; want applied", pod, b.Seq, res, err)
	}
	return res
}

func wantNotOwner(t *testing.T, s store.Store, pod string, b *store.Batch) {
	t.Helper()
	res, err := s.Apply(context.Background(), pod, b)
	if !errors.Is(err, store.ErrNotOwner) || res != (store.Result{}) {
		t.Fatalf("Apply(%s, seq %d) = %+v, %v; want ErrNotOwner", pod, b.Seq, res, err)
	}
}

// matches returns the blocks each pod matches of keys.
func matches(t *testing.T, s store.Store, keys []uint64) map[string]int {
	t.Helper()
	out, err := s.Lookup(context.Background(), keys, nil, nil)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	m := map[string]int{}
	for _, mt := range out {
		m[mt.Pod] = mt.Blocks
	}
	return m
}

func podBlocks(t *testing.T, s store.Store) map[string]int {
	t.Helper()
	ps, err := s.Pods(context.Background())
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	m := map[string]int{}
	for _, p := range ps {
		m[p.Name] = p.Blocks
	}
	return m
}

func wantSeq(t *testing.T, s store.Store, pod string, want uint64) {
	t.Helper()
	seq, ok, err := s.AppliedSeq(context.Background(), pod)
	if err != nil || !ok || seq != want {
		t.Fatalf("AppliedSeq(%s) = %d, %v, %v; want %d", pod, seq, ok, err, want)
	}
}

// eventually retries f every 20ms until it returns nil, for at most 20s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after 20s", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLease checks the write lease between two stores with different
// owners on one index: the holder's batches apply, the other's are
// refused without changing anything, and the lease passes to the other
// once its holder stops applying for LeaseTTL.
func testLease(t *testing.T, url string) {
	const ttl = time.Second
	prefix := freshPrefix()
	a := newStore(t, url, redis.Options{Prefix: prefix, Owner: "replica-a", LeaseTTL: ttl})
	b := newStore(t, url, redis.Options{Prefix: prefix, Owner: "replica-b", LeaseTTL: ttl})
	k := storetest.Keys(1, 8)
	mustApply(t, a, "p", batch(1, addOp(k[:4]...)))

	// b is refused, for a new batch, a duplicate, and a clear alike.
	wantNotOwner(t, b, "p", batch(2, addOp(k[4:]...)))
	wantNotOwner(t, b, "p", batch(1, addOp(k[4:]...)))
	wantNotOwner(t, b, "p", batch(3, store.Op{Kind: store.OpClear}))
	wantSeq(t, a, "p", 1)
	if got := matches(t, b, k); !maps(got, map[string]int{"p": 4}) {
		t.Fatalf("after refused batches: %v", got)
	}
	// Other pods are b's to take, and then a's to be refused.
	mustApply(t, b, "q", batch(1, addOp(k[:2]...)))
	wantNotOwner(t, a, "q", batch(2, addOp(k...)))
	// Both see everything.
	if got := matches(t, a, k); !maps(got, map[string]int{"p": 4, "q": 2}) {
		t.Fatalf("Lookup from a: %v", got)
	}

	// Applying keeps the lease: a applies again within the TTL, and b is
	// still refused once the first lease would have lapsed.
	time.Sleep(ttl * 6 / 10)
	mustApply(t, a, "p", batch(2, addOp(k[4:6]...)))
	time.Sleep(ttl * 6 / 10)
	wantNotOwner(t, b, "p", batch(3, addOp(k[6:]...)))

	// Hand-over: a stops; b takes the pod once the lease lapsed, from
	// the applied seq a left.
	eventually(t, "b taking over p", func() error {
		_, err := b.Apply(context.Background(), "p", batch(3, addOp(k[6:]...)))
		return err
	})
	if res, err := b.Apply(context.Background(), "p", batch(2, addOp(k...))); err != nil || !res.Duplicate || res.AppliedSeq != 3 {
		t.Fatalf("b applying a's seq again = %+v, %v; want a duplicate of 3", res, err)
	}
	wantNotOwner(t, a, "p", batch(4, store.Op{Kind: store.OpClear}))
	if got := matches(t, a, k); !maps(got, map[string]int{"p": 8, "q": 2}) {
		t.Fatalf("after hand-over: %v", got)
	}
}

func maps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// testLeaseForget checks that ForgetPod takes the lease like Apply: the
// pod's applier forgets it, another process is refused.
func testLeaseForget(t *testing.T, url string) {
	prefix := freshPrefix()
	a := newStore(t, url, redis.Options{Prefix: prefix, Owner: "a", LeaseTTL: time.Minute})
	b := newStore(t, url, redis.Options{Prefix: prefix, Owner: "b", LeaseTTL: time.Minute})
	k := storetest.Keys(2, 4)
	mustApply(t, a, "p", batch(5, addOp(k...)))
	if err := b.ForgetPod(context.Background(), "p"); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("ForgetPod by another owner: %v, want ErrNotOwner", err)
	}
	wantSeq(t, b, "p", 5)
	// Forgetting a pod nobody knows does nothing, for anyone.
	if err := b.ForgetPod(context.Background(), "nope"); err != nil {
		t.Fatalf("ForgetPod(unknown): %v", err)
	}
	if err := a.ForgetPod(context.Background(), "p"); err != nil {
		t.Fatalf("ForgetPod by the owner: %v", err)
	}
	if got := matches(t, b, k); len(got) != 0 {
		t.Fatalf("after ForgetPod: %v", got)
	}
	if _, ok, err := b.AppliedSeq(context.Background(), "p"); ok || err != nil {
		t.Fatalf("AppliedSeq after ForgetPod: %v, %v", ok, err)
	}
	// The owner keeps the lease for the pod's next life.
	mustApply(t, a, "p", batch(1, addOp(k[0])))
	wantNotOwner(t, b, "p", batch(2, addOp(k[1])))
}

// testBlockTTL checks BlockTTL: blocks stored again stay, the others
// expire, and Pods stops counting them once it has checked the pod.
func testBlockTTL(t *testing.T, url string) {
	const ttl = time.Second
	s := newStore(t, url, redis.Options{BlockTTL: ttl})
	keep, lapse := storetest.Keys(3, 4), storetest.Keys(4, 6)
	var seq uint64
	apply := func(ops ...store.Op) {
		seq++
		mustApply(t, s, "p", batch(seq, ops...))
	}
	apply(addOp(keep...), addOp(lapse...))
	mustApply(t, s, "other", batch(1, addOp(lapse[:2]...)))
	if got := podBlocks(t, s); !maps(got, map[string]int{"p": 10, "other": 2}) {
		t.Fatalf("Pods = %v", got)
	}
	// Store keep again every ttl/5 until lapse has expired.
	eventually(t, "lapse expiring", func() error {
		apply(addOp(keep...))
		if got := matches(t, s, lapse); len(got) != 0 {
			time.Sleep(ttl / 5)
			return fmt.Errorf("lapse still matches %v", got)
		}
		return nil
	})
	if got := matches(t, s, keep); !maps(got, map[string]int{"p": 4}) {
		t.Fatalf("keep, stored again, = %v", got)
	}
	// Pods counts what is left once it has checked each pod, within
	// about a TTL of its first look.
	eventually(t, "Pods counting what is left", func() error {
		apply(addOp(keep...))
		if got := podBlocks(t, s); !maps(got, map[string]int{"p": 4, "other": 0}) {
			time.Sleep(ttl / 5)
			return fmt.Errorf("Pods = %v", got)
		}
		return nil
	})
	// An expired block stored again counts once; ForgetPod is whole.
	apply(addOp(lapse[0]), addOp(lapse[0]))
	if got := podBlocks(t, s); got["p"] != 5 {
		t.Fatalf("Pods after storing an expired block again = %v", got)
	}
	if err := s.ForgetPod(context.Background(), "p"); err != nil {
		t.Fatal(err)
	}
	if got := matches(t, s, slices.Concat(keep, lapse)); len(got) != 0 {
		t.Fatalf("after ForgetPod: %v", got)
	}
}

// testForgetChunks forgets and clears pods of more blocks than one chunk
// of ForgetPod, holding blocks of another pod's too.
func testForgetChunks(t *testing.T, url string) {
	s := newStore(t, url, redis.Options{})
	k := storetest.Keys(5, 5000)
	mustApply(t, s, "big", batch(1, addOp(k...), store.Op{Kind: store.OpAdd, Tier: store.TierCPU, Keys: k[:100]}))
	mustApply(t, s, "small", batch(1, addOp(k[:10]...)))
	mustApply(t, s, "cleared", batch(1, addOp(k...)))
	if got := podBlocks(t, s); !maps(got, map[string]int{"big": 5000, "small": 10, "cleared": 5000}) {
		t.Fatalf("Pods = %v", got)
	}
	if err := s.ForgetPod(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, "cleared", batch(2, store.Op{Kind: store.OpClear}, addOp(k[4999])))
	if got := podBlocks(t, s); !maps(got, map[string]int{"small": 10, "cleared": 1}) {
		t.Fatalf("Pods after ForgetPod and clear = %v", got)
	}
	if got := matches(t, s, k); !maps(got, map[string]int{"small": 10}) {
		t.Fatalf("Lookup = %v", got)
	}
}

// testSharedIndex checks that two stores on one prefix are one index:
// what one applies, the other looks up, lists and resolves, and model
// state is shared.
func testSharedIndex(t *testing.T, url string) {
	ctx := context.Background()
	prefix := freshPrefix()
	a := newStore(t, url, redis.Options{Prefix: prefix})
	b := newStore(t, url, redis.Options{Prefix: prefix})
	other := newStore(t, url, redis.Options{})
	k, e := storetest.Keys(6, 4), storetest.Keys(60, 4)
	mustApply(t, a, "p", batch(1, store.Op{Kind: store.OpAdd, Keys: k, Engine: e}))
	if got := matches(t, b, k); !maps(got, map[string]int{"p": 4}) {
		t.Fatalf("b's Lookup = %v", got)
	}
	if got := podBlocks(t, b); !maps(got, map[string]int{"p": 4}) {
		t.Fatalf("b's Pods = %v", got)
	}
	keys, found, err := b.EngineKeys(ctx, "p", e, nil, nil)
	if err != nil || !slices.Equal(keys, k) || slices.Contains(found, false) {
		t.Fatalf("b's EngineKeys = %v, %v, %v", keys, found, err)
	}
	if m, err := a.DecideKeyMode(ctx, "m", store.KeyModeTokens); err != nil || m != store.KeyModeTokens {
		t.Fatal(m, err)
	}
	if m, err := b.DecideKeyMode(ctx, "m", store.KeyModeEngine); err != nil || m != store.KeyModeTokens {
		t.Fatalf("b's DecideKeyMode = %q, %v; want a's decision", m, err)
	}
	// Another prefix is another index.
	if got := matches(t, other, k); len(got) != 0 {
		t.Fatalf("another prefix's Lookup = %v", got)
	}
	if ms, err := other.Models(ctx); err != nil || len(ms) != 0 {
		t.Fatalf("another prefix's Models = %v, %v", ms, err)
	}
}

func testPing(t *testing.T, url string) {
	s := newStore(t, url, redis.Options{})
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// testEngineMapBound stores blocks with engine hashes and removes them by
// key, over and over: pairs whose key went are swept, so that the map
// stays within about twice the pod's blocks (plus 256).
func testEngineMapBound(t *testing.T, url string) {
	prefix := freshPrefix()
	s := newStore(t, url, redis.Options{Prefix: prefix})
	held := storetest.Keys(12, 50)
	mustApply(t, s, "p", batch(1, store.Op{Kind: store.OpAdd, Keys: held, Engine: storetest.Keys(120, 50)}))
	for r := range 60 {
		k, e := storetest.Keys(uint64(1300+r), 100), storetest.Keys(uint64(2300+r), 100)
		mustApply(t, s, "p", batch(uint64(2*r+2), store.Op{Kind: store.OpAdd, Keys: k, Engine: e}))
		mustApply(t, s, "p", batch(uint64(2*r+3), store.Op{Kind: store.OpRemove, Keys: k}))
	}
	n, err := hlen(url, "{"+prefix+"p:p}e")
	if err != nil {
		t.Fatal(err)
	}
	// The sweep runs while the map is over twice the blocks held plus
	// 256 when pairs are added (150 blocks then), a batch behind at most;
	// on a cluster, where the swept pairs are dropped in a batch's last
	// step, after its block writes, and HSCAN's counts are hints, up to
	// two more batches' pairs (seen: 731).
	limit := 2*(len(held)+100) + 256 + 100
	if strings.HasPrefix(url, "redis-cluster://") {
		limit += 2 * 100
	}
	if n > limit {
		t.Fatalf("engine map of a pod of %d blocks has %d pairs after 6000 added and removed, want at most %d", len(held), n, limit)
	}
	keys, found, err := s.EngineKeys(context.Background(), "p", storetest.Keys(120, 50), nil, nil)
	if err != nil || !slices.Equal(keys, held) || slices.Contains(found, false) {
		t.Fatalf("the held blocks' pairs: %v, %v, %v", keys, found, err)
	}
}

// hlen returns the length of a hash, on whichever node of url holds it.
func hlen(url, key string) (int, error) {
	addrs := strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "redis-cluster://"), "redis://"), ",")
	for _, a := range addrs {
		v, err := redistest.Do(a, "HLEN", key)
		if err != nil && strings.HasPrefix(err.Error(), "MOVED") {
			continue
		}
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(v)
	}
	return 0, fmt.Errorf("no node holds %s", key)
}

// A batch clearing a pod of more blocks than one script takes at a time
// (the clear goes a chunk a script ahead of the batch's own) ends as the
// batch says, on one node and on a cluster; the same batch again is a
// duplicate and changes nothing.
func TestLargeClear(t *testing.T) {
	for _, kind := range []string{"single", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			url := redistest.Server(t)
			if kind == "cluster" {
				url = redistest.Cluster(t)
			}
			s := newStore(t, url, redis.Options{})
			ctx := context.Background()
			const pod, n = "10.0.0.1:8000", 5000
			keys := storetest.Keys(7, n)
			if _, err := s.Apply(ctx, pod, &store.Batch{Seq: 1, Ops: []store.Op{{Kind: store.OpAdd, Tier: store.TierGPU, Keys: keys}}}); err != nil {
				t.Fatal(err)
			}
			other := []uint64{1, 2}
			b := &store.Batch{Seq: 2, Ops: []store.Op{
				{Kind: store.OpAdd, Tier: store.TierGPU, Keys: other[:1]},
				{Kind: store.OpClear},
				{Kind: store.OpAdd, Tier: store.TierCPU, Keys: other[1:]},
			}}
			res, err := s.Apply(ctx, pod, b)
			if err != nil || res.Duplicate || res.AppliedSeq != 2 {
				t.Fatalf("Apply = %+v, %v", res, err)
			}
			again, err := s.Apply(ctx, pod, b)
			if err != nil || !again.Duplicate {
				t.Fatalf("Apply again = %+v, %v; want a duplicate", again, err)
			}
			pods, err := s.Pods(ctx)
			if err != nil || len(pods) != 1 || pods[0].Blocks != 1 || pods[0].AppliedSeq != 2 {
				t.Fatalf("Pods = %+v, %v; want one block at seq 2", pods, err)
			}
			m, err := s.Lookup(ctx, []uint64{keys[0]}, nil, nil)
			if err != nil || len(m) != 0 {
				t.Fatalf("a cleared block is still held: %+v, %v", m, err)
			}
			m, err = s.Lookup(ctx, other[1:], nil, nil)
			if err != nil || len(m) != 1 || m[0].TierBlocks[store.TierCPU] != 1 {
				t.Fatalf("the block added after the clear: %+v, %v", m, err)
			}
		})
	}
}
