package memory

import (
	"context"
	"fmt"

	"github.com/prefixd/prefixd/store"
)

// Apply applies pod's batch b, op by op, and records b.Seq as the pod's
// applied seq; a batch at or below it is a duplicate and changes nothing.
// The batch is checked whole first. Batches of one pod apply one at a
// time, those of different pods at once.
//
// An OpAdd gives its keys consecutive records, after the records of its
// Parent when it has one and they are free (see the package
// documentation). When a shard is full it evicts a holding first from a
// pod over its cache size or fair share; a key that still does not fit is
// skipped. Both count against the pod they take from: its matches are
// Incomplete until it is cleared. An OpRemove from the GPU tier teaches
// the store the pod's cache size (SetCacheBlocks).
//
// When ctx is canceled between ops, Apply returns its error with the ops
// before applied and the applied seq unchanged; the Result counts what
// was done.
func (s *Store) Apply(ctx context.Context, pod string, b *store.Batch) (store.Result, error) {
	if err := check(ctx, pod); err != nil {
		return store.Result{}, err
	}
	if err := b.Validate(); err != nil {
		return store.Result{}, err
	}
	st, err := s.lockState(pod, true)
	if err != nil {
		if n := addedKeys(b); n > 0 {
			s.skipped.Add(int64(n))
			s.metrics.dropped.WithLabelValues(dropPods).Add(float64(n))
		}
		return store.Result{}, err
	}
	defer st.mu.Unlock()
	var res store.Result
	if st.hasSeq.Load() {
		if res.AppliedSeq = st.seq.Load(); b.Seq <= res.AppliedSeq {
			res.Duplicate = true
			return res, nil
		}
	}
	// The ops need no more than the pod's lock: it keeps the pod's id
	// the pod's, and everything they touch that other pods share is the
	// shards' (and the arena's) to guard.
	var counts applyCounts
	for i := range b.Ops {
		if i > 0 {
			if err = ctx.Err(); err != nil {
				err = fmt.Errorf("memory: op %d of %d: %w", i, len(b.Ops), err)
				break
			}
		}
		op := &b.Ops[i]
		switch op.Kind {
		case store.OpAdd:
			res.Unknown += s.addOp(st, op, &counts)
		case store.OpRemove:
			r, u := s.removeOp(st, op)
			res.Removed += r
			res.Unknown += u
		case store.OpClear:
			s.clearOp(st)
		}
	}
	if counts != (applyCounts{}) {
		counts.flush(s)
	}
	if err != nil {
		s.dropIfEmpty(st)
		return res, err
	}
	st.seq.Store(b.Seq)
	st.hasSeq.Store(true)
	res.AppliedSeq = b.Seq
	return res, nil
}

// addedKeys counts the blocks b's OpAdds name, for a batch refused whole.
func addedKeys(b *store.Batch) int {
	n := 0
	for i := range b.Ops {
		if op := &b.Ops[i]; op.Kind == store.OpAdd {
			n += max(len(op.Keys), len(op.Engine))
		}
	}
	return n
}

// applyCounts are what one Apply evicted and skipped, for the metrics.
type applyCounts struct {
	evicted [numReasons]int
	skipped int
}

func (c *applyCounts) flush(s *Store) {
	evicted := 0
	for why, n := range c.evicted {
		if n > 0 {
			evicted += n
			s.metrics.evictions[why].Add(float64(n))
		}
	}
	if evicted > 0 {
		s.evicted.Add(int64(evicted))
	}
	if c.skipped > 0 {
		s.skipped.Add(int64(c.skipped))
		s.metrics.dropped.WithLabelValues(dropCapacity).Add(float64(c.skipped))
	}
}

// addOp applies an OpAdd of pod st and returns how many of its engine
// hashes named no block the pod holds. st.mu is held.
func (s *Store) addOp(st *podState, op *store.Op, c *applyCounts) (unknown int) {
	bit := uint64(1) << op.Tier
	switch {
	case len(op.Keys) > 0:
		s.addKeys(st.id, bit, op.Keys, op.Parent, op.HasParent, c)
		if len(op.Engine) > 0 {
			s.recordEngine(st, op.Keys, op.Engine)
		}
	case len(op.Engine) > 0:
		unknown = s.addTiers(st, bit, op.Engine)
	}
	return unknown
}

// addKeys records that pod id holds keys on the tiers in bit; keys that
// continue a chain whose last block is parent (chained) go after its
// record when they can.
func (s *Store) addKeys(id uint16, bit uint64, keys []uint64, parent uint64, chained bool, c *applyCounts) {
	ad := adder{id: id}
	skipped := 0 // for want of records
	for start := 0; start < len(keys); start += maxRun {
		part := keys[start:min(start+maxRun, len(keys))]
		// The keys get consecutive records, those already stored excepted:
		// after their parent's if they can, else from the head. Short
		// runs that continue a chain, as decoding stores, leave room for
		// the blocks that follow.
		reserve := 0
		if chained && len(part) <= chainReserve {
			reserve = chainReserve
		}
		var (
			seg *segment
			off int
			ok  bool
		)
		if chained && start == 0 {
			ph := mix(parent)
			if _, _, pseg, poff, found := s.shard(ph).get(ph); found && s.arena.claim(pseg, poff, len(part), reserve) {
				seg, off, ok = pseg, poff+1, true
			}
		}
		if !ok {
			if seg, off, ok = s.arena.alloc(len(part), reserve); !ok {
				skipped += len(part)
				continue
			}
		}
		used, filled := 0, 0 // records used: up to the last one, and in all
		for i, k := range part {
			if i%maxChunk == 0 && len(part) > 1 {
				keep(s.touch(part[i:min(i+maxChunk, len(part))]))
			}
			h := mix(k)
			sh := s.shard(h)
			sh.lock()
			u := sh.add(h, &ad, bit, seg, off+i)
			sh.unlock()
			if u {
				used = i + 1
				filled++
			}
		}
		// Counted once for the run, not a locked add a key.
		s.arena.filled(seg, filled)
		s.arena.finish(seg, off, used, len(part), reserve)
		s.pods.addHeld(id, ad.gained)
		ad.gained = 0
	}
	if skipped += ad.skipped; skipped > 0 {
		s.pods.evicted[id].Add(int64(skipped))
	}
	if s.arena.nsparse.Load() > 0 && s.arena.wasteful() {
		s.compact()
	}
	for why, n := range ad.evicted {
		c.evicted[why] += n
	}
	c.skipped += skipped
}

// maxRun is the most keys of one OpAdd given consecutive records: a run
// never spans segments, and the head segment wastes at most this many
// records when it fills.
const maxRun = 256

// chainReserve is how many records an OpAdd with a Parent of at most as
// many keys leaves free after them, for the next to continue the chain
// in: decoding stores a request's blocks one at a time, between other
// requests' blocks.
const chainReserve = 16

// addTiers adds the tiers in bit to the blocks pod st holds as the given
// engine hashes (a block offloaded to another tier) and returns how many
// hashes named no block the pod holds: a block the pod no longer holds is
// gone, not to be added back by hash.
func (s *Store) addTiers(st *podState, bit uint64, hashes []uint64) (unknown int) {
	for _, e := range hashes {
		k, ok := st.engine[e]
		if ok {
			h := mix(k)
			sh := s.shard(h)
			sh.lock()
			ok = sh.addTier(h, st.id, bit)
			sh.unlock()
		}
		if !ok {
			unknown++
		}
	}
	return unknown
}

// removeOp applies an OpRemove of pod st and returns how many (key, tier)
// holdings it removed and how many of the blocks it named the pod did not
// hold on that tier. Named by engine hash, the blocks the pod no longer
// holds on any tier leave its map. st.mu is held.
func (s *Store) removeOp(st *podState, op *store.Op) (removed, unknown int) {
	id := st.id
	bit := uint64(1) << op.Tier
	var held int64
	if op.Tier == store.TierGPU {
		held = s.pods.held[id].Load()
	}
	lost := 0
	var rel release
	if len(op.Keys) > 0 || len(op.Engine) == 0 {
		for start := 0; start < len(op.Keys); start += maxChunk {
			r, l := s.unsetRun(id, bit, op.Keys[start:min(start+maxChunk, len(op.Keys))], nil, nil, &rel)
			removed += r
			lost += l
		}
		unknown = len(op.Keys) - removed
	} else {
		var ks, hs [maxChunk]uint64
		for start := 0; start < len(op.Engine); start += maxChunk {
			n := 0
			for _, e := range op.Engine[start:min(start+maxChunk, len(op.Engine))] {
				if k, ok := st.engine[e]; ok {
					ks[n], hs[n] = k, e
					n++
				} else {
					unknown++
				}
			}
			r, l := s.unsetRun(id, bit, ks[:n], hs[:n], st.engine, &rel)
			removed += r
			lost += l
			unknown += n - r
		}
		st.pairs.Store(int64(len(st.engine)))
	}
	rel.flush(&s.arena)
	s.pods.addHeld(id, -int64(lost))
	if op.Tier == store.TierGPU && removed > 0 {
		// The engine evicted from a full cache: it holds at least what it
		// held before.
		s.pods.learn(id, held)
	}
	if s.arena.nsparse.Load() > 0 && s.arena.wasteful() {
		s.compact()
	}
	return removed, unknown
}

// unsetRun clears the tiers in bit of pod id's holdings of keys (at most
// maxChunk) and returns how many it cleared and how many keys the pod
// lost, holding them on no tier any more. With hashes, the engine hashes
// of keys, the hash of every key lost is deleted from engine.
func (s *Store) unsetRun(id uint16, bit uint64, keys, hashes []uint64, engine map[uint64]uint64, rel *release) (removed, lost int) {
	if len(keys) > 1 {
		keep(s.touch(keys))
	}
	for i, k := range keys {
		h := mix(k)
		sh := s.shard(h)
		sh.lock()
		r, l := sh.unset(h, id, bit, true, rel)
		sh.unlock()
		if r {
			removed++
		}
		if l {
			lost++
			if hashes != nil {
				delete(engine, hashes[i])
			}
		}
	}
	return removed, lost
}

// clearOp applies an OpClear: every block of pod st and its engine-hash
// map go, and what its blocks taught (evictions, learned cache size); its
// id, seq and stale mark stay. A lookup running meanwhile may see some of
// the blocks still there. st.mu is held.
func (s *Store) clearOp(st *podState) {
	s.clearBlocks(st.id)
	s.pods.cleared(st.id)
	st.engine, st.sweepFloor = nil, 0
	st.pairs.Store(0)
}
