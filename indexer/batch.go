package indexer

import (
	"context"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/store"
)

// batcher turns one pod's event batches into store batches, reusing its
// memory from batch to batch. It belongs to its pod (pod.mu held).
type batcher struct {
	sb   store.Batch
	keys []uint64 // the tokens-mode keys the ops point into
	// added maps the engine hashes this batch stores to their keys (tokens
	// key mode), so that an event continuing a block stored earlier in the
	// same batch finds its parent before the store has it.
	added        map[uint64]uint64
	parent       [1]uint64 // EngineKeys scratch
	parentKey    []uint64
	parentFound  []bool
	drops        [numDrops]int
	unknownEvent int
	clears       int
	// stored counts BlockStored blocks by group kind, indexed ([0]) or
	// skipped ([1]); skips counts blocks not applied, by reason.
	stored       [events.NumSpecKinds][2]int
	skips        [numSkips]int
	copiesRemain int
	copyCounts   int // blocks of removals whose remaining_copy_counts did not fit
	unknownMedia int
	// removedKeys holds the hashes of removals left after dropping those
	// with copies remaining; ops point into it (an append that moves it
	// leaves the earlier ops their own copy).
	removedKeys []uint64
}

// Drop reasons counted per batch, by index.
const (
	dropIdxUnknownParent = iota
	dropIdxBlockSize
	dropIdxTokenCount
	numDrops
)

var dropNames = [numDrops]string{dropUnknownParent, dropBlockSize, dropTokenCount}

// build returns the store batch of b for pod p in key mode mode: one op
// per event that changes the pod. The hash check of each BlockStored runs
// here (see model.check).
func (bt *batcher) build(ctx context.Context, ix *Indexer, p *pod, mode KeyMode, b *events.Batch) (*store.Batch, error) {
	bt.sb.Seq = b.Seq
	bt.sb.Ops = bt.sb.Ops[:0]
	bt.drops, bt.unknownEvent, bt.clears = [numDrops]int{}, 0, 0
	bt.stored, bt.skips, bt.copiesRemain, bt.copyCounts, bt.unknownMedia = [events.NumSpecKinds][2]int{}, [numSkips]int{}, 0, 0, 0
	bt.removedKeys = bt.removedKeys[:0]
	clear(bt.added)
	if mode == KeyModeTokens {
		// The keys of every event fit: no append moves the ones the ops
		// point into.
		n := 0
		for i := range b.Events {
			n += len(b.Events[i].BlockHashes)
		}
		if cap(bt.keys) < n {
			bt.keys = make([]uint64, 0, n)
		}
		bt.keys = bt.keys[:0]
	}
	for i := range b.Events {
		e := &b.Events[i]
		tier := tierOf(e.Medium)
		if e.Medium == events.MediumOther && e.Kind != events.KindAllBlocksCleared {
			bt.unknownMedia++
		}
		switch e.Kind {
		case events.KindBlockStored:
			kind, why := p.classify(ix, e)
			if why != keep {
				bt.stored[kind][1] += len(e.BlockHashes)
				if why == skipBlockSize {
					// The hash check says why: a full-attention group at
					// another block size than the model's (classify logs
					// the pod's size once it changes).
					bt.drops[dropIdxBlockSize] += len(e.BlockHashes)
					ix.metrics.hashChecks.WithLabelValues(p.model.name, "mismatch").Inc()
					ix.metrics.mismatches.WithLabelValues(p.model.name, "block_size").Inc()
				} else {
					bt.skips[why] += len(e.BlockHashes)
				}
				continue
			}
			bt.stored[kind][0] += len(e.BlockHashes)
			if len(e.TokenIDs) > 0 {
				p.model.check(ix, p, e)
			}
			if mode == KeyModeEngine {
				bt.sb.Ops = append(bt.sb.Ops, store.Op{Kind: store.OpAdd, Tier: tier, Keys: e.BlockHashes, Parent: e.ParentHash, HasParent: e.HasParent})
				continue
			}
			if err := bt.storedTokens(ctx, ix, p, e, tier); err != nil {
				return nil, err
			}
		case events.KindBlockRemoved:
			if _, why := p.classify(ix, e); why != keep {
				bt.skips[why] += len(e.BlockHashes)
				continue
			}
			hashes := bt.removable(e)
			if len(hashes) == 0 {
				continue
			}
			op := store.Op{Kind: store.OpRemove, Tier: tier, Keys: hashes}
			if mode == KeyModeTokens {
				op.Keys, op.Engine = nil, hashes
			}
			bt.sb.Ops = append(bt.sb.Ops, op)
		case events.KindAllBlocksCleared:
			bt.sb.Ops = append(bt.sb.Ops, store.Op{Kind: store.OpClear})
			clear(bt.added)
			bt.clears++
		default:
			bt.unknownEvent++
		}
	}
	return &bt.sb, nil
}

// removable returns the hashes of removal e that leave the pod: those
// whose remaining_copy_counts say no copy is left on the medium, or all of
// them when the event gives no counts (or counts that do not fit its
// hashes, counted).
func (bt *batcher) removable(e *events.Event) []uint64 {
	if len(e.RemainingCopies) == 0 {
		return e.BlockHashes
	}
	if len(e.RemainingCopies) != len(e.BlockHashes) {
		bt.copyCounts += len(e.BlockHashes)
		return e.BlockHashes
	}
	start := len(bt.removedKeys)
	for i, h := range e.BlockHashes {
		if e.RemainingCopies[i] > 0 {
			bt.copiesRemain++
			continue
		}
		bt.removedKeys = append(bt.removedKeys, h)
	}
	return bt.removedKeys[start:len(bt.removedKeys):len(bt.removedKeys)]
}

// storedTokens adds the op of a BlockStored event in tokens key mode:
// prefixd's own chain over its token ids, continuing its parent's key.
func (bt *batcher) storedTokens(ctx context.Context, ix *Indexer, p *pod, e *events.Event, tier store.Tier) error {
	if len(e.TokenIDs) == 0 {
		// The blocks are known by engine hash; this event adds a tier.
		bt.sb.Ops = append(bt.sb.Ops, store.Op{Kind: store.OpAdd, Tier: tier, Engine: e.BlockHashes})
		return nil
	}
	m := p.model
	hs := m.hashers()
	n := len(e.BlockHashes)
	bs := hs.blockSize
	switch {
	case e.BlockSize != 0 && e.BlockSize != bs:
		bt.drops[dropIdxBlockSize] += n
		return nil
	case len(e.TokenIDs) != n*bs:
		bt.drops[dropIdxTokenCount] += n
		return nil
	}
	start := len(bt.keys)
	var parent uint64
	if e.HasParent {
		k, ok := bt.added[e.ParentHash]
		if !ok {
			var err error
			if k, ok, err = bt.engineKey(ctx, ix, p, e.ParentHash); err != nil {
				return err
			}
		}
		if !ok {
			bt.drops[dropIdxUnknownParent] += n
			return nil
		}
		parent = k
		bt.keys, _ = rechain(hs.own, bt.keys, k, e.TokenIDs)
	} else {
		bt.keys = prompt(hs.own, bt.keys, e.TokenIDs, m.prompt(e))
	}
	keys := bt.keys[start:len(bt.keys):len(bt.keys)]
	if bt.added == nil {
		bt.added = make(map[uint64]uint64)
	}
	for i, h := range e.BlockHashes {
		bt.added[h] = keys[i]
	}
	bt.sb.Ops = append(bt.sb.Ops, store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys, Engine: e.BlockHashes, Parent: parent, HasParent: e.HasParent})
	return nil
}

// engineKey resolves one engine hash through the pod's map in the store.
func (bt *batcher) engineKey(ctx context.Context, ix *Indexer, p *pod, h uint64) (uint64, bool, error) {
	bt.parent[0] = h
	var err error
	bt.parentKey, bt.parentFound, err = ix.store.EngineKeys(ctx, p.name, bt.parent[:], bt.parentKey, bt.parentFound)
	if err != nil || len(bt.parentFound) != 1 || !bt.parentFound[0] {
		return 0, false, err
	}
	return bt.parentKey[0], true, nil
}

// count counts what an applied batch did: its events by kind, the blocks
// it could not apply by reason, its clears.
func (bt *batcher) count(ix *Indexer, p *pod, b *events.Batch, res store.Result) {
	var kinds [events.KindAllBlocksCleared + 1]int
	for i := range b.Events {
		if k := b.Events[i].Kind; int(k) < len(kinds) {
			kinds[k]++
		}
	}
	kinds[events.KindUnknown] += b.Skipped
	ix.countSkippedNames(b)
	for k, n := range kinds {
		p.countEvents(ix, events.Kind(k), n)
	}
	for i, n := range bt.drops {
		ix.drop(dropNames[i], n)
	}
	ix.drop(dropUnknownEvent, bt.unknownEvent)
	ix.drop(dropUnknownHash, res.Unknown)
	for why, n := range bt.skips {
		if n > 0 {
			ix.metrics.skipped.WithLabelValues(skipNames[why]).Add(float64(n))
		}
	}
	if bt.copiesRemain > 0 {
		ix.metrics.skipped.WithLabelValues("copies_remain").Add(float64(bt.copiesRemain))
	}
	if bt.copyCounts > 0 {
		ix.metrics.skipped.WithLabelValues("copy_counts_mismatch").Add(float64(bt.copyCounts))
	}
	if bt.unknownMedia > 0 {
		ix.metrics.unknownMedia.Add(float64(bt.unknownMedia))
	}
	for k := range bt.stored {
		for outcome, n := range bt.stored[k] {
			if n > 0 {
				p.countStored(ix, events.SpecKind(k), outcome, n)
			}
		}
	}
	if bt.clears > 0 {
		ix.metrics.clears.WithLabelValues("all_blocks_cleared").Add(float64(bt.clears))
	}
}
