package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// podState is what the store keeps of one known pod besides its blocks:
// its applied seq, its engine-hash map and the lock that makes its changes
// serial. A pod is known, with one id and one podState, from its first
// Apply (or SetStale(true)) until ForgetPod; its stale mark, block counts
// and evictions are in podStats, by the same id.
type podState struct {
	id   uint16 // fixed for the life of the state
	name string

	// mu serializes Apply, ForgetPod, SetStale and EngineKeys of the pod,
	// and guards the fields below it. It is the first lock in the store's
	// lock order (see Store).
	mu sync.Mutex
	// gone is set when the state stopped being the pod's (ForgetPod, or a
	// pod left with nothing to remember): whoever locks it then looks the
	// pod up again.
	gone bool
	// engine maps an engine hash to the key the pod stored it under (tokens
	// key mode). An entry whose key the pod no longer holds on any tier
	// resolves nothing: every reader checks the holding. An OpRemove by
	// its hash that takes the key off its last tier deletes it;
	// sweepEngine deletes the others once the map outgrows the pod's
	// blocks.
	engine map[uint64]uint64
	// sweepFloor is the size the map must reach before the next sweep: half
	// again what the last sweep left, so that sweeps cost a bounded number
	// of checks per entry added however many entries survive them.
	sweepFloor int

	// seq is the applied seq, valid once hasSeq is set. Both are written
	// under mu (seq first) and read without it by Pods and AppliedSeq
	// (hasSeq first), so that a reader that sees hasSeq sees a seq applied
	// since.
	seq    atomic.Uint64
	hasSeq atomic.Bool
	// pairs is len(engine), for Stats, which does not take mu.
	pairs atomic.Int64
}

// engineSlack is how many entries a pod's engine-hash map may have beyond
// twice the pod's blocks before it is swept.
const engineSlack = 256

// lockState returns pod's state, locked, making the pod known when create
// is set and it is not (which may fail with ErrTooManyPods). Without
// create it returns nil for an unknown pod.
func (s *Store) lockState(pod string, create bool) (*podState, error) {
	for {
		s.mu.RLock()
		id, ok := s.ids[pod]
		var st *podState
		if ok {
			st = s.states[id]
		}
		s.mu.RUnlock()
		if !ok {
			if !create {
				return nil, nil
			}
			var err error
			if st, err = s.intern(pod); err != nil {
				return nil, err
			}
		}
		st.mu.Lock()
		if !st.gone {
			return st, nil
		}
		// Forgotten between the look-up and the lock: look again.
		st.mu.Unlock()
	}
}

// intern makes pod known: it gives it an id and a state.
func (s *Store) intern(pod string) (*podState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.ids[pod]; ok {
		return s.states[id], nil
	}
	var id uint16
	switch n := len(s.free); {
	case n > 0:
		id = s.free[n-1]
		s.free = s.free[:n-1]
		s.names[id] = pod
	case len(s.names) < MaxPods:
		id = uint16(len(s.names))
		s.names = append(s.names, pod)
		s.states = append(s.states, nil)
	default:
		return nil, fmt.Errorf("%w: %d pods known, cannot add %q", ErrTooManyPods, MaxPods, pod)
	}
	st := &podState{id: id, name: pod}
	s.states[id] = st
	s.ids[pod] = id
	s.live[id/64] |= 1 << (id % 64)
	s.pods.reset(id, s.cacheSizes[pod])
	return st, nil
}

// dropIfEmpty forgets the pod of st, whose lock is held, when it has
// nothing the store must remember: no block, seq, stale mark or eviction.
// Only a pod whose first Apply failed before it changed anything, or one
// known only by a stale mark that was lifted, is in that state; freeing
// its id at once keeps MaxPods for pods that have something.
func (s *Store) dropIfEmpty(st *podState) {
	id := st.id
	if st.hasSeq.Load() || s.pods.held[id].Load() != 0 || s.pods.stale[id].Load() || s.pods.evicted[id].Load() != 0 {
		return
	}
	st.gone = true
	st.engine = nil
	st.pairs.Store(0)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, st.name)
	s.live[id/64] &^= 1 << (id % 64)
	for i := range s.shards {
		// It holds nothing; its ownership lists may still list keys.
		sh := &s.shards[i].shard
		sh.mu.Lock()
		sh.forget(id)
		sh.mu.Unlock()
	}
	s.names[id] = ""
	s.states[id] = nil
	s.free = append(s.free, id)
}

// ForgetPod removes every block of pod, its engine-hash map, applied seq
// and stale mark. It costs the pod's own blocks plus one lock per shard.
// The pod disappears from lookups and Pods at once, and a later Apply of
// the same name starts a new pod while this one's blocks are still being
// dropped; its id is reused only once every shard has dropped them.
func (s *Store) ForgetPod(ctx context.Context, pod string) error {
	if err := check(ctx, pod); err != nil {
		return err
	}
	st, _ := s.lockState(pod, false)
	if st == nil {
		return nil
	}
	defer st.mu.Unlock()
	id := st.id
	st.gone = true
	st.engine = nil
	st.pairs.Store(0)
	s.mu.Lock()
	delete(s.ids, pod)
	s.live[id/64] &^= 1 << (id % 64)
	s.mu.Unlock()
	s.clearBlocks(id)
	s.mu.Lock()
	s.names[id] = ""
	s.states[id] = nil
	s.free = append(s.free, id)
	s.mu.Unlock()
	return nil
}

// clearBlocks drops every holding of pod id, shard by shard, then
// compacts what that left sparse.
func (s *Store) clearBlocks(id uint16) {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i].shard
		sh.lock()
		n += sh.clearPod(id)
		sh.unlock()
	}
	s.pods.addHeld(id, -int64(n))
	for s.arena.nsparse.Load() > 0 && s.arena.wasteful() && s.compact() {
	}
}

// AppliedSeq returns the seq of pod's last batch applied, and false when
// it has none. It waits for no Apply.
func (s *Store) AppliedSeq(ctx context.Context, pod string) (uint64, bool, error) {
	if err := check(ctx, pod); err != nil {
		return 0, false, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.ids[pod]
	if !ok {
		return 0, false, nil
	}
	if st := s.states[id]; st.hasSeq.Load() {
		return st.seq.Load(), true, nil
	}
	return 0, false, nil
}

// SetStale sets pod's stale mark. Marking an unknown pod stale makes it
// known, and fails with ErrTooManyPods when MaxPods pods are; lifting the
// mark of a pod known by it alone forgets the pod.
func (s *Store) SetStale(ctx context.Context, pod string, stale bool) error {
	if err := check(ctx, pod); err != nil {
		return err
	}
	st, err := s.lockState(pod, stale)
	if err != nil || st == nil {
		return err
	}
	defer st.mu.Unlock()
	s.pods.stale[st.id].Store(stale)
	if !stale {
		s.dropIfEmpty(st)
	}
	return nil
}

// EngineKeys looks hashes up in pod's engine-hash map and appends, for
// each, the key the pod holds it under and true, or 0 and false when the
// map has no entry or the pod no longer holds the entry's key. It
// allocates nothing when keys and found have room.
func (s *Store) EngineKeys(ctx context.Context, pod string, hashes []uint64, keys []uint64, found []bool) ([]uint64, []bool, error) {
	keys, found = keys[:0], found[:0]
	if err := check(ctx, pod); err != nil {
		return keys, found, err
	}
	st, _ := s.lockState(pod, false)
	if st == nil {
		for range hashes {
			keys = append(keys, 0)
			found = append(found, false)
		}
		return keys, found, nil
	}
	defer st.mu.Unlock()
	for _, h := range hashes {
		k, ok := st.engine[h]
		if ok && !s.holds(st.id, k) {
			k, ok = 0, false
		}
		keys = append(keys, k)
		found = append(found, ok)
	}
	return keys, found, nil
}

// holds reports whether pod id holds key k on any tier, reading the index
// as a lookup does.
func (s *Store) holds(id uint16, k uint64) bool {
	h := mix(k)
	w, set, _, _, ok := s.shard(h).get(h)
	if !ok {
		return false
	}
	if w&ovfFlag == 0 {
		_, _, found := inlineFind(w, id)
		return found
	}
	i, _ := set.find(id)
	return i >= 0
}

// recordEngine records that pod st holds keys[i] as engine hash
// engine[i], then sweeps the map when it has outgrown the pod's blocks.
// st.mu is held.
func (s *Store) recordEngine(st *podState, keys, engine []uint64) {
	if st.engine == nil {
		st.engine = make(map[uint64]uint64, len(engine))
	}
	for i, h := range engine {
		st.engine[h] = keys[i]
	}
	if n := len(st.engine); n >= st.sweepFloor && n > 2*int(s.pods.held[st.id].Load())+engineSlack {
		s.sweepEngine(st)
	}
	st.pairs.Store(int64(len(st.engine)))
}

// sweepEngine deletes the entries of st's engine-hash map whose key the
// pod no longer holds: those of blocks evicted for capacity, which no
// BlockRemoved will name, and those of keys removed under another hash.
// It runs once the map has more than twice the pod's blocks and half again
// what the last sweep left, so that its cost, a read of the index per
// entry, is a bounded number of reads per entry ever added. st.mu is held.
func (s *Store) sweepEngine(st *podState) {
	before := len(st.engine)
	for h, k := range st.engine {
		if !s.holds(st.id, k) {
			delete(st.engine, h)
		}
	}
	n := len(st.engine)
	st.sweepFloor = n + n/2 + engineSlack
	if n < before/2 {
		// A map keeps the room of its largest size: copy what is left
		// into one of its own size.
		m := make(map[uint64]uint64, n)
		for h, k := range st.engine {
			m[h] = k
		}
		st.engine = m
	}
}
