package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/store"
)

// model is the obvious implementation of the contract, to compare with.
type model map[string]*podModel

// podModel is what the contract says of one pod.
type podModel struct {
	held   map[uint64]uint32 // key -> tier mask
	engine map[uint64]uint64 // engine hash -> key, held or not
	seq    uint64
	hasSeq bool
	stale  bool
}

func (m model) pod(name string) *podModel {
	p := m[name]
	if p == nil {
		p = &podModel{held: map[uint64]uint32{}, engine: map[uint64]uint64{}}
		m[name] = p
	}
	return p
}

// resolve returns the key engine hash h names: a pair whose key the pod
// holds.
func (p *podModel) resolve(h uint64) (uint64, bool) {
	k, ok := p.engine[h]
	return k, ok && p.held[k] != 0
}

// apply applies op and returns the holdings it removed and what it named
// in vain.
func (p *podModel) apply(op store.Op) (removed, unknown int) {
	bit := uint32(1) << op.Tier
	switch op.Kind {
	case store.OpClear:
		clear(p.held)
		clear(p.engine)
	case store.OpAdd:
		if len(op.Keys) > 0 {
			for _, k := range op.Keys {
				p.held[k] |= bit
			}
			for i, h := range op.Engine {
				p.engine[h] = op.Keys[i]
			}
			return 0, 0
		}
		for _, h := range op.Engine {
			if k, ok := p.resolve(h); ok {
				p.held[k] |= bit
			} else {
				unknown++
			}
		}
	case store.OpRemove:
		keys, hashes := op.Keys, []uint64(nil)
		if len(keys) == 0 {
			keys = nil
			for _, h := range op.Engine {
				if k, ok := p.resolve(h); ok {
					keys = append(keys, k)
					hashes = append(hashes, h)
				} else {
					unknown++
				}
			}
		}
		for i, k := range keys {
			v := p.held[k]
			if v&bit == 0 {
				unknown++
				continue
			}
			removed++
			if v &^= bit; v != 0 {
				p.held[k] = v
				continue
			}
			delete(p.held, k)
			if hashes != nil {
				// Removed by hash from its last tier: the pair goes. (A
				// pair whose key goes otherwise stays, resolving nothing
				// until the pod holds the key again.)
				delete(p.engine, hashes[i])
			}
		}
	}
	return removed, unknown
}

func (m model) lookup(keys []uint64, pods []string) map[string]store.Match {
	out := map[string]store.Match{}
	if len(keys) == 0 {
		return out
	}
	for pod, p := range m {
		if len(pods) > 0 && !slices.Contains(pods, pod) {
			continue
		}
		mt := store.Match{Stale: p.stale}
		for _, k := range keys {
			v := p.held[k]
			if v == 0 {
				break
			}
			mt.Blocks++
			mt.TierBlocks[bits.TrailingZeros32(v)]++
		}
		if mt.Blocks > 0 {
			out[pod] = mt
		}
	}
	return out
}

func (m model) pods() []store.PodInfo {
	var out []store.PodInfo
	for _, name := range slices.Sorted(maps.Keys(m)) {
		p := m[name]
		if len(p.held) > 0 || p.hasSeq || p.stale {
			out = append(out, store.PodInfo{Name: name, Blocks: len(p.held), AppliedSeq: p.seq, HasSeq: p.hasSeq, Stale: p.stale})
		}
	}
	return out
}

// checkInvariants verifies the shards' internal consistency.
func checkInvariants(t testing.TB, s *Store) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	pressured := 0
	for si := range s.shards {
		if s.shards[si].pressure.Load() {
			pressured++
		}
	}
	if got := s.pressured.Load(); int(got) != pressured {
		t.Fatalf("%d shards under pressure counted, %d flagged", got, pressured)
	}
	referenced := map[uint32]bool{}
	for si := range s.shards {
		sh := &s.shards[si].shard
		sh.mu.Lock()
		tb := sh.tbl.Load()
		n, holdings, sets := 0, 0, 0
		count := make([]int32, len(sh.count))
		for j := range tb.end() {
			e := tb.at(j)
			if e == 0 {
				continue
			}
			n++
			r := s.arena.rec(entryLoc(e))
			if r == nil {
				t.Fatalf("shard %d slot %d: entry %#x names no record", si, j, e)
			}
			if referenced[entryLoc(e)] {
				t.Fatalf("shard %d slot %d: record %#x named twice", si, j, entryLoc(e))
			}
			referenced[entryLoc(e)] = true
			h, w := r.k, r.w
			if empty(w) {
				t.Fatalf("shard %d slot %d: key %#x has a dead record", si, j, h)
			}
			if got := s.shard(h); got != sh {
				t.Fatalf("shard %d slot %d: key %#x belongs to another shard", si, j, h)
			}
			if entryFrac(e) != tb.frac(h) {
				t.Fatalf("shard %d slot %d: entry %#x for key %#x", si, j, e, h)
			}
			if hb := tb.home(h); j < hb {
				t.Fatalf("shard %d slot %d: key %#x before its home %d", si, j, h, hb)
			} else if j > hb && (tb.at(j-1) == 0 || entryFrac(tb.at(j-1)) > entryFrac(e)) {
				t.Fatalf("shard %d slot %d: key %#x with home %d follows a gap or a greater fraction", si, j, h, hb)
			}
			if _, fr, ok := tb.find(&s.arena, h); !ok || fr != r {
				t.Fatalf("shard %d slot %d: key %#x not found by find (probe invariant broken)", si, j, h)
			}
			var held []uint64
			if w&ovfFlag == 0 {
				if w&^(ageMask|1<<(inline*holderBits)-1) != 0 {
					t.Fatalf("shard %d slot %d: stray bits in %#x", si, j, w)
				}
				for shift := uint(0); shift < inline*holderBits; shift += holderBits {
					if hd := w >> shift & holderMask; maskOf(hd) != 0 {
						held = append(held, hd)
					} else if hd != 0 {
						t.Fatalf("shard %d slot %d: absent holder with bits %#x", si, j, hd)
					}
				}
			} else {
				sets++
				set := sh.loadSet(w)
				if set == nil || len(set.h) <= inline {
					t.Fatalf("shard %d slot %d: overflow word %#x with set %+v", si, j, w, set)
				}
				for _, hd := range set.h {
					held = append(held, uint64(hd))
				}
			}
			ids := map[uint16]bool{}
			for _, hd := range held {
				id := idOf(hd)
				if ids[id] || maskOf(hd) == 0 {
					t.Fatalf("shard %d slot %d: bad holders %#v", si, j, held)
				}
				ids[id] = true
				if int(id) >= len(count) {
					t.Fatalf("shard %d: holder id %d beyond bookkeeping (%d)", si, id, len(count))
				}
				count[id]++
				holdings++
				if !slices.Contains(sh.list(id), tb.frac(h)) {
					t.Fatalf("shard %d: pod %d holds %#x but its ownership list lacks it", si, id, h)
				}
				if s.names[id] == "" {
					t.Fatalf("shard %d: key %#x held by unused id %d", si, h, id)
				}
			}
		}
		if n != sh.n || holdings != sh.holdings || sets != sh.nsets {
			t.Fatalf("shard %d: counted %d keys, %d holdings, %d sets; bookkeeping says %d, %d, %d", si, n, holdings, sets, sh.n, sh.holdings, sh.nsets)
		}
		if !slices.Equal(count, sh.count) {
			t.Fatalf("shard %d: per-pod counts %v, bookkeeping %v", si, count, sh.count)
		}
		if holdings > sh.capacity {
			t.Fatalf("shard %d: %d holdings over capacity %d", si, holdings, sh.capacity)
		}
		if uint64(n)*maxLoadDen > tb.nSlots*maxLoadNum+maxLoadDen {
			t.Fatalf("shard %d: %d keys in %d slots", si, n, tb.nSlots)
		}
		for id := range sh.owned {
			l := sh.list(uint16(id))
			if c := int(sh.count[id]); len(l) > c+c/2+ownedSlack+1 {
				t.Fatalf("shard %d: pod %d owns a list of %d for %d keys", si, id, len(l), c)
			}
		}
		sh.mu.Unlock()
	}
	// The store-wide totals agree with the shards'.
	held := make([]int64, MaxPods)
	for si := range s.shards {
		sh := &s.shards[si].shard
		sh.mu.Lock()
		for id, c := range sh.count {
			held[id] += int64(c)
		}
		if v := sh.victim; v != noVictim && int(v) >= len(sh.count) {
			t.Fatalf("shard %d: victim %d beyond bookkeeping (%d)", si, v, len(sh.count))
		}
		sh.mu.Unlock()
	}
	holding := 0
	for id := range held {
		if got := s.pods.held[id].Load(); got != held[id] {
			t.Fatalf("pod %d (%q): %d holdings counted, the shards hold %d", id, s.nameOf(uint16(id)), got, held[id])
		}
		if held[id] > 0 {
			holding++
		}
	}
	if got := s.pods.holding.Load(); int(got) != holding {
		t.Fatalf("%d pods holding blocks counted, %d hold some", got, holding)
	}
	// Every live record is named by the index, and the segments count
	// them.
	segs := 0
	for n := range s.arena.dir.Load().s {
		seg := s.arena.dir.Load().s[n].Load()
		if seg == nil {
			continue
		}
		segs++
		if seg.num != uint32(n) {
			t.Fatalf("segment %d numbered %d", n, seg.num)
		}
		live := 0
		for off := range seg.r {
			if empty(seg.r[off].w) {
				continue
			}
			live++
			if !referenced[seg.loc(off)] {
				t.Fatalf("segment %d record %d: live word %#x of key %#x, not in the index", n, off, seg.r[off].w, seg.r[off].k)
			}
		}
		if int(seg.live.Load()) != live {
			t.Fatalf("segment %d: %d live records, counted %d", n, live, seg.live.Load())
		}
	}
	if int64(segs) != s.arena.segs.Load() {
		t.Fatalf("%d segments, counted %d", segs, s.arena.segs.Load())
	}
}

// nameOf returns the name of pod id, for messages; mu is held.
func (s *Store) nameOf(id uint16) string {
	if int(id) < len(s.names) {
		return s.names[id]
	}
	return ""
}

// ops applies a random sequence of operations read from data to s and to
// the model and compares every answer. Keys come from universe; engine
// hashes are the keys' complements.
func ops(t testing.TB, s *Store, data []byte, universe []uint64) {
	ctx := context.Background()
	m := model{}
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return int(b)
	}
	keyOf := func(i int) uint64 { return universe[i%len(universe)] }
	keys := func() []uint64 {
		ks := make([]uint64, next()%24)
		for i := range ks {
			ks[i] = keyOf(next()<<2 | next()&3)
		}
		return ks
	}
	hashesOf := func(ks []uint64) []uint64 {
		hs := make([]uint64, len(ks))
		for i, k := range ks {
			hs[i] = ^k
		}
		return hs
	}
	randOp := func() store.Op {
		op := store.Op{Tier: store.Tier(next() % int(store.NumTiers))}
		switch next() % 8 {
		case 0, 1:
			op.Kind, op.Keys = store.OpAdd, keys()
		case 2:
			// After a parent that may be held, by this pod or another.
			op.Kind, op.Keys, op.Parent, op.HasParent = store.OpAdd, keys(), keyOf(next()), true
		case 3:
			op.Kind, op.Keys = store.OpAdd, keys()
			op.Engine = hashesOf(op.Keys)
		case 4:
			op.Kind, op.Engine = store.OpAdd, hashesOf(keys())
		case 5:
			op.Kind, op.Keys = store.OpRemove, keys()
		case 6:
			op.Kind, op.Engine = store.OpRemove, hashesOf(keys())
		case 7:
			op = store.Op{Kind: store.OpClear}
		}
		return op
	}
	var (
		out   []store.Match
		ekeys []uint64
		found []bool
	)
	for step := 0; len(data) > 0; step++ {
		op, name := next()%10, fmt.Sprintf("p%d", next()%40)
		switch op {
		case 0, 1, 2, 3:
			b := &store.Batch{Ops: make([]store.Op, next()%4)}
			for i := range b.Ops {
				b.Ops[i] = randOp()
			}
			p := m.pod(name)
			if p.hasSeq {
				b.Seq = p.seq + 1 + uint64(next()%3)
			}
			var want store.Result
			for _, op := range b.Ops {
				r, u := p.apply(op)
				want.Removed += r
				want.Unknown += u
			}
			p.seq, p.hasSeq = b.Seq, true
			want.AppliedSeq = b.Seq
			if got, err := s.Apply(ctx, name, b); err != nil || got != want {
				t.Fatalf("step %d: Apply(%s, %+v) = %+v, %v; want %+v", step, name, b, got, err, want)
			}
		case 4:
			// A duplicate, or a batch with an invalid op: nothing changes.
			p := m[name]
			b := &store.Batch{Ops: []store.Op{randOp(), randOp()}}
			if p == nil || !p.hasSeq || next()%2 == 0 {
				b.Ops = append(b.Ops, store.Op{Kind: store.OpAdd, Tier: store.NumTiers, Keys: keys()})
				if _, err := s.Apply(ctx, name, b); !errors.Is(err, store.ErrInvalidTier) {
					t.Fatalf("step %d: Apply(%s) of an invalid batch: %v", step, name, err)
				}
				break
			}
			b.Seq = p.seq - uint64(next()%2)
			if b.Seq > p.seq {
				b.Seq = p.seq
			}
			if got, err := s.Apply(ctx, name, b); err != nil || got != (store.Result{Duplicate: true, AppliedSeq: p.seq}) {
				t.Fatalf("step %d: Apply(%s) of a duplicate = %+v, %v", step, name, got, err)
			}
		case 5:
			if err := s.ForgetPod(ctx, name); err != nil {
				t.Fatalf("step %d: ForgetPod: %v", step, err)
			}
			delete(m, name)
		case 6:
			stale := next()%2 == 0
			if err := s.SetStale(ctx, name, stale); err != nil {
				t.Fatalf("step %d: SetStale: %v", step, err)
			}
			if p := m[name]; p != nil || stale {
				m.pod(name).stale = stale
			}
		case 7:
			ks := keys()
			var filter []string
			for range next() % 3 {
				filter = append(filter, fmt.Sprintf("p%d", next()%44))
			}
			var err error
			out, err = s.Lookup(ctx, ks, filter, out)
			if err != nil {
				t.Fatalf("step %d: Lookup: %v", step, err)
			}
			got := map[string]store.Match{}
			for _, mt := range out {
				got[mt.Pod] = store.Match{Blocks: mt.Blocks, TierBlocks: mt.TierBlocks, Stale: mt.Stale}
			}
			if want := m.lookup(ks, filter); !maps.Equal(got, want) {
				t.Fatalf("step %d: Lookup(%d keys, %q):\n got %v\nwant %v", step, len(ks), filter, got, want)
			}
		case 8:
			hs := hashesOf(keys())
			var err error
			ekeys, found, err = s.EngineKeys(ctx, name, hs, ekeys, found)
			if err != nil || len(ekeys) != len(hs) || len(found) != len(hs) {
				t.Fatalf("step %d: EngineKeys = %d, %d, %v", step, len(ekeys), len(found), err)
			}
			for i, h := range hs {
				var k uint64
				ok := false
				if p := m[name]; p != nil {
					k, ok = p.resolve(h)
				}
				if found[i] != ok || ok && ekeys[i] != k {
					t.Fatalf("step %d: EngineKeys(%s): hash %#x = %#x, %v; want %#x, %v", step, name, h, ekeys[i], found[i], k, ok)
				}
			}
		case 9:
			got, err := s.Pods(ctx)
			if want := m.pods(); err != nil || !slices.Equal(got, want) {
				t.Fatalf("step %d: Pods = %v, %v\nwant %v", step, got, err, want)
			}
			checkInvariants(t, s)
		}
	}
	checkInvariants(t, s)
}

func TestModel(t *testing.T) {
	for _, shards := range []int{1, 4} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("shards=%d/seed=%d", shards, seed), func(t *testing.T) {
				s, err := New(Options{Shards: shards})
				if err != nil {
					t.Fatal(err)
				}
				data := make([]byte, 12000)
				rng := rand.New(rand.NewPCG(seed, 7))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				ops(t, s, data, spread)
			})
		}
	}
}

// spread is 1024 keys over every shard, 0 and 2^64-1 among them.
var spread = func() []uint64 {
	u := make([]uint64, 1024)
	for i := range u {
		u[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	u[1] = 1<<64 - 1
	return u
}()

// unmix inverts mix.
func unmix(h uint64) uint64 {
	inv := uint64(0x9e3779b97f4a7c15) // Newton's iteration for the inverse mod 2^64
	for range 5 {
		inv *= 2 - 0x9e3779b97f4a7c15*inv
	}
	x := h * inv
	return x ^ x>>32
}

// colliding is keys of one shard (of any count) whose mixed values share a
// few 32-bit fractions, the case ownership lists must get right.
var colliding = func() []uint64 {
	var u []uint64
	for f := range uint64(3) {
		for low := range uint64(12) {
			u = append(u, unmix((0x7000_0000+f)<<32|low*0x1234567))
		}
	}
	return u
}()

func TestUnmix(t *testing.T) {
	for _, k := range []uint64{0, 1, 1<<64 - 1, 0x123456789abcdef} {
		if got := unmix(mix(k)); got != k {
			t.Fatalf("unmix(mix(%#x)) = %#x", k, got)
		}
	}
}

func TestModelCollidingFractions(t *testing.T) {
	for seed := range uint64(10) {
		s, err := New(Options{Shards: 4})
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 10000)
		rng := rand.New(rand.NewPCG(seed, 9))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		ops(t, s, data, colliding)
	}
}

func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 0, 4, 1, 2, 3, 4, 5, 6, 7, 8, 6, 1, 0, 4, 1, 2, 3, 4, 7})
	f.Add([]byte("\x00\x01\x00\x08abcdefghijklmnop\x00\x02\x00\x08abcdefghijklmnop\x00\x03\x00\x08abcdefghijklmnop\x06\x00\x00\x08abcdefghijklmnop\x07"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := New(Options{Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		ops(t, s, data, spread)
	})
}

// TestEvictionInvariants fills small stores far beyond capacity, with many
// holders per key, and checks the bookkeeping stays consistent.
func TestEvictionInvariants(t *testing.T) {
	ctx := context.Background()
	for _, capacity := range []int{1, 7, 300, 2000} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			s, err := New(Options{CapacityBlocks: capacity})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(capacity), 3))
			for i := range 3000 {
				pod := fmt.Sprintf("p%d", rng.IntN(30))
				ks := make([]uint64, rng.IntN(16))
				for j := range ks {
					ks[j] = uint64(rng.IntN(4 * capacity))
				}
				switch rng.IntN(10) {
				case 0:
					if _, err := testRemove(s, pod, store.TierGPU, ks); err != nil {
						t.Fatal(err)
					}
				case 1:
					if err := s.ForgetPod(ctx, pod); err != nil {
						t.Fatal(err)
					}
				default:
					if err := testAdd(s, pod, store.Tier(rng.IntN(3)), ks); err != nil {
						t.Fatal(err)
					}
				}
				if i%100 == 0 {
					checkInvariants(t, s)
				}
			}
			checkInvariants(t, s)
			st := s.Stats()
			if st.Blocks > capacity || st.Evicted == 0 {
				t.Fatalf("stats %+v: want at most %d blocks and some evictions", st, capacity)
			}
		})
	}
}

// TestDisownKeepsSharedFraction removes, from the end of a pod's
// ownership list, one of two keys the pod holds with the same fraction,
// after compaction has left that fraction listed once: the entry must stay
// for the other key, or ForgetPod would leave it behind.
func TestDisownKeepsSharedFraction(t *testing.T) {
	ctx := context.Background()
	s, err := New(Options{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	const f = 0x7000_0000
	k1, k2 := unmix(f<<32|1), unmix(f<<32|2)
	others := make([]uint64, 20)
	for i := range others {
		others[i] = unmix(uint64(i+1) << 40)
	}
	if err := testAdd(s, "a", store.TierGPU, others); err != nil {
		t.Fatal(err)
	}
	if err := testAdd(s, "a", store.TierGPU, []uint64{k1, k2}); err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0].shard
	id := s.ids["a"]
	sh.lock()
	sh.compactOwned(id) // f listed once for both keys
	sh.unlock()
	if l := sh.list(id); len(l) != len(others)+1 || l[len(l)-1] != uint32(f) {
		t.Fatalf("ownership list %x, want the others' fractions then %x once", l, f)
	}
	if _, err := testRemove(s, "a", store.TierGPU, []uint64{k1}); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, s)
	if err := s.ForgetPod(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Lookup(ctx, []uint64{k2}, nil, nil); err != nil || len(out) != 0 {
		t.Fatalf("after ForgetPod, Lookup(k2) = %+v, %v", out, err)
	}
}
