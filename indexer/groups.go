package indexer

import (
	"github.com/prefixd/prefixd/events"
)

// Hybrid models (full attention mixed with sliding-window, chunked local
// or Mamba layers) publish their events per KV cache group: each
// BlockStored names its group (group_idx) and the group's kind, each
// BlockRemoved its group only. The groups share block hashes, and a
// sliding-window group removes the blocks that fall out of its window
// while the full-attention group still holds them.
//
// Only full-attention groups say which prefixes a replica can reuse, and
// of those one is indexed per pod: the first full-attention group whose
// events come at the model's block size (vLLM publishes a request's
// groups in index order, so it is the lowest). A replica reuses a block
// only while every full-attention group holds it, and the groups store a
// request's blocks together and free them together, the lowest group's
// first: its events are the pod's. The others are counted and skipped,
// so that one group's removal never takes a block from another.
//
// Events without group_idx are of the pod's only group, indexed as
// before groups existed. A group's kind is learned from its BlockStored
// events; a removal for a group no BlockStored named yet is counted and
// not applied: the blocks it names were never indexed from that group.

// maxGroups bounds the groups a pod's events may name; groups past it are
// treated as never named (their removals counted as unknown_group).
const maxGroups = 64

// skip says why an event's blocks are not indexed.
type skip uint8

const (
	keep skip = iota
	skipKind
	skipSecondary
	skipUnknownGroup
	skipRemote
	skipBlockSize // a full-attention group at another block size than the model's
	numSkips
)

var skipNames = [numSkips]string{"", "kind", "secondary_group", "unknown_group", "remote", "block_size"}

// groups is what a pod's events said of its KV cache groups. It belongs to
// its pod (pod.mu held).
type groups struct {
	kinds   map[int64]events.SpecKind
	indexed int64 // the pod's indexed full-attention group, when has
	has     bool
}

// reset forgets the groups, as when the pod's engine restarted.
func (g *groups) reset() { *g = groups{} }

// reusable reports whether blocks of kind k are whole prefixes: a full
// attention kind, or no kind named (a publisher without groups).
func reusable(k events.SpecKind) bool { return k == events.SpecNone || k.FullAttention() }

// classify says whether event e's blocks are indexed, and the kind of its
// group, learning from BlockStored events. bs is the model's block size.
// It returns whether the group was named for the first time.
func (g *groups) classify(e *events.Event, bs int) (kind events.SpecKind, why skip, learned bool) {
	kind = e.SpecKind
	if e.Locality == events.LocalityRemote {
		return kind, skipRemote, false
	}
	if !e.HasGroupIdx {
		if !reusable(kind) {
			return kind, skipKind, false
		}
		return kind, keep, false
	}
	known, ok := g.kinds[e.GroupIdx]
	if e.Kind == events.KindBlockStored {
		if kind == events.SpecNone {
			kind = known
		}
		if !ok || known != kind {
			if ok || len(g.kinds) < maxGroups {
				if g.kinds == nil {
					g.kinds = make(map[int64]events.SpecKind)
				}
				g.kinds[e.GroupIdx] = kind
				learned = !ok
				ok = true
			}
		}
	} else {
		if !ok {
			return events.SpecNone, skipUnknownGroup, false
		}
		kind = known
	}
	if !reusable(kind) {
		return kind, skipKind, learned
	}
	if g.has && e.GroupIdx == g.indexed {
		return kind, keep, learned
	}
	if e.Kind != events.KindBlockStored || !ok {
		return kind, skipSecondary, learned
	}
	if e.BlockSize != 0 && len(e.TokenIDs) > 0 && e.BlockSize != bs {
		return kind, skipBlockSize, learned
	}
	if g.has {
		return kind, skipSecondary, learned
	}
	g.indexed, g.has = e.GroupIdx, true
	return kind, keep, learned
}

// count returns how many groups of kind k the pod's events named.
func (g *groups) count(k events.SpecKind) int {
	n := 0
	for _, v := range g.kinds {
		if v == k {
			n++
		}
	}
	return n
}

// classify classifies event e of pod p (groups.classify), learning the
// model's block size from the first full-attention BlockStored event with
// tokens, and keeping the pod's group and block size gauges.
func (p *pod) classify(ix *Indexer, e *events.Event) (events.SpecKind, skip) {
	hs := p.model.hashers()
	if e.Kind == events.KindBlockStored && len(e.TokenIDs) > 0 && e.BlockSize > 0 && e.Locality != events.LocalityRemote && reusable(p.groups.kindOf(e)) {
		if !hs.learned {
			hs = p.model.learnBlockSize(ix, p, e.BlockSize)
		}
		if e.BlockSize != p.blockSize {
			p.blockSize = e.BlockSize
			ix.metrics.podBlockSize.WithLabelValues(p.name).Set(float64(e.BlockSize))
			if e.BlockSize != hs.blockSize {
				ix.log.Warn("a pod's block size differs from its model's: its full-attention blocks cannot be matched", "pod", p.name, "model", p.model.name, "pod_block_size", e.BlockSize, "model_block_size", hs.blockSize)
			}
		}
	}
	kind, why, learned := p.groups.classify(e, hs.blockSize)
	if learned {
		p.groupKinds |= 1 << kind
		ix.metrics.groups.WithLabelValues(p.name, kindLabel(kind)).Set(float64(p.groups.count(kind)))
	}
	return kind, why
}

// kindOf returns the kind of e's group: the kind e names, or the one its
// group's earlier events named.
func (g *groups) kindOf(e *events.Event) events.SpecKind {
	if e.SpecKind != events.SpecNone || !e.HasGroupIdx {
		return e.SpecKind
	}
	return g.kinds[e.GroupIdx]
}

// kindLabel is a kind's metric label: its wire name, "none" for events
// that name no group kind.
func kindLabel(k events.SpecKind) string {
	if k == events.SpecNone {
		return "none"
	}
	return k.String()
}

var outcomeNames = [2]string{"indexed", "skipped"}

// countStored counts n blocks of BlockStored events of kind k with the
// outcome (0 indexed, 1 skipped), creating the pod's series when first
// used.
func (p *pod) countStored(ix *Indexer, k events.SpecKind, outcome, n int) {
	c := p.stored[k][outcome]
	if c == nil {
		c = ix.metrics.storedBlocks.WithLabelValues(p.name, kindLabel(k), outcomeNames[outcome])
		p.stored[k][outcome] = c
	}
	c.Add(float64(n))
}

// deleteGroupSeries deletes the pod's series of group kinds, stored
// blocks and block size.
func (ix *Indexer) deleteGroupSeries(p *pod) {
	for k := range p.stored {
		for outcome, c := range p.stored[k] {
			if c != nil {
				ix.metrics.storedBlocks.DeleteLabelValues(p.name, kindLabel(events.SpecKind(k)), outcomeNames[outcome])
			}
		}
	}
	for k := range events.NumSpecKinds {
		if p.groupKinds&(1<<k) != 0 {
			ix.metrics.groups.DeleteLabelValues(p.name, kindLabel(k))
		}
	}
	ix.metrics.podBlockSize.DeleteLabelValues(p.name)
}
