package indexer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer/blockhash"
)

// model holds what the indexer knows of one served model: how to hash it,
// and which key mode it uses.
type model struct {
	name string
	opts ModelOptions
	// hs are the model's hashers at its block size: the configured one
	// until the first full-attention BlockStored event with tokens says
	// otherwise (learnBlockSize).
	hs      atomic.Pointer[hashers]
	learnMu sync.Mutex // serializes learnBlockSize

	decided atomic.Uint32 // KeyMode once decided; KeyModeAuto before
	pods    atomic.Int32  // pods of the model this process knows

	mu      sync.Mutex // protects the fields below while undecided
	pending []pendingBatch
	// Events without a parent prove the whole chain (seed, model root, block
	// function); events with one prove only the block function.
	rootMatches, rootMismatches, chainMatches int
	lastReason                                string

	warnedRoot atomic.Bool // a root mismatch was logged at warning level
	verified   atomic.Bool // the engine scheme reproduced an event of the model
}

type pendingBatch struct {
	pod   *pod
	batch *events.Batch
}

// model returns the model named name, creating it with the key mode the
// store has decided for it, if any.
func (ix *Indexer) model(ctx context.Context, name string) (*model, error) {
	ix.mu.RLock()
	m := ix.models[name]
	ix.mu.RUnlock()
	if m != nil {
		return m, nil
	}
	if ix.fullOfModels() {
		return nil, ix.refuse(RefuseMaxModels, "model %s: %d models are known, the limit (--max-models)", name, ix.opts.MaxModels)
	}
	opts := ix.opts.model(name)
	engine, own, err := newHashers(opts)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", name, err)
	}
	mode := opts.KeyMode
	if mode != KeyModeAuto {
		// A configured mode is recorded, so that replicas configured
		// otherwise see the disagreement instead of writing two key spaces.
		recorded, err := ix.store.DecideKeyMode(ctx, name, mode.String())
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", name, err)
		}
		if recorded != mode.String() {
			ix.log.Warn("the store has another key mode for this model, decided by another process: using the store's", "model", name, "configured", mode.String(), "store", recorded)
			mode, _ = ParseKeyMode(recorded)
		}
	} else if states, err := ix.store.Models(ctx); err != nil {
		return nil, fmt.Errorf("model %q: %w", name, err)
	} else if st, ok := states[name]; ok && st.KeyMode != "" {
		mode, _ = ParseKeyMode(st.KeyMode)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if m = ix.models[name]; m != nil {
		return m, nil
	}
	if len(ix.models) >= ix.opts.MaxModels {
		return nil, ix.refuse(RefuseMaxModels, "model %s: %d models are known, the limit (--max-models)", name, ix.opts.MaxModels)
	}
	m = &model{name: name, opts: opts}
	m.hs.Store(&hashers{blockSize: opts.BlockSize, engine: engine, own: own})
	m.decided.Store(uint32(mode))
	ix.models[name] = m
	ix.metrics.keyMode.WithLabelValues(name, mode.String()).Set(1)
	ix.metrics.blockSize.WithLabelValues(name).Set(float64(opts.BlockSize))
	return m, nil
}

func (ix *Indexer) fullOfModels() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.models) >= ix.opts.MaxModels
}

func (m *model) mode() KeyMode { return KeyMode(m.decided.Load()) }

// hashers are a model's chains at one block size: engine is the configured
// scheme, meant to reproduce the engine's hashes; own is prefixd's own
// chain, used in tokens mode.
type hashers struct {
	blockSize int
	engine    *blockhash.Hasher
	own       *blockhash.Hasher
	learned   bool // blockSize came from an event
}

func (m *model) hashers() *hashers { return m.hs.Load() }

// maxLearnedBlockSize bounds the block sizes learned from events: larger
// ones (hostile, or a group that is not full attention) are not learned.
const maxLearnedBlockSize = 4096

// learnBlockSize makes bs, the block size of a full-attention BlockStored
// event of pod p, the model's, unless one was learned already: every
// BlockStored carries its block size, and a configured one that differs
// would make every query and token chain wrong. It returns the model's
// hashers after the call.
func (m *model) learnBlockSize(ix *Indexer, p *pod, bs int) *hashers {
	h := m.hashers()
	if h.learned || bs <= 0 || bs > maxLearnedBlockSize {
		return h
	}
	m.learnMu.Lock()
	defer m.learnMu.Unlock()
	if h = m.hashers(); h.learned {
		return h
	}
	next := &hashers{blockSize: h.blockSize, engine: h.engine, own: h.own, learned: true}
	if bs != h.blockSize {
		o := m.opts
		o.BlockSize = bs
		engine, own, err := newHashers(o)
		if err != nil {
			ix.log.Warn("block size of the events not usable: keeping the configured one", "model", m.name, "pod", p.name, "events", bs, "configured", h.blockSize, "err", err)
			m.hs.Store(next)
			return next
		}
		ix.log.Warn("the events' block size differs from the configured one: using the events'", "model", m.name, "pod", p.name, "events", bs, "configured", h.blockSize)
		next.blockSize, next.engine, next.own = bs, engine, own
	}
	m.hs.Store(next)
	ix.metrics.blockSize.WithLabelValues(m.name).Set(float64(next.blockSize))
	return next
}

// prompt describes an event's prompt for hashing: the model and the
// adapter the event names.
func (m *model) prompt(e *events.Event) blockhash.Prompt {
	return blockhash.Prompt{Model: m.name, LoRA: string(e.LoRAName)}
}

// verdict is what re-chaining one BlockStored event showed.
type verdict uint8

const (
	verdictUnverifiable verdict = iota
	verdictMatch
	verdictMismatch
)

// verify re-chains a BlockStored event with the engine scheme and compares
// it with the published hashes. reason explains a mismatch.
func (m *model) verify(p *pod, e *events.Event) (v verdict, reason string) {
	n := len(e.BlockHashes)
	h := m.hashers()
	bs := h.blockSize
	if n == 0 || len(e.TokenIDs) == 0 {
		return verdictUnverifiable, ""
	}
	if e.BlockSize != 0 && e.BlockSize != bs {
		return verdictMismatch, "block_size"
	}
	if len(e.TokenIDs) != n*bs {
		return verdictMismatch, "token_count"
	}
	var got []uint64
	if e.HasParent {
		var ok bool
		got, ok = rechain(h.engine, p.buf[:0], e.ParentHash, e.TokenIDs)
		if !ok {
			return verdictUnverifiable, ""
		}
	} else {
		got = prompt(h.engine, p.buf[:0], e.TokenIDs, m.prompt(e))
	}
	p.buf = got
	if equal(got, e.BlockHashes) {
		return verdictMatch, ""
	}
	if !e.HasParent {
		return verdictMismatch, "root"
	}
	// A parent before a prompt's first block: the engine listed blocks that
	// do not continue their parent (llm-d-inference-sim does this when it
	// re-stores evicted blocks from the middle of a prompt).
	first := prompt(h.engine, p.buf[:0], e.TokenIDs[:bs], m.prompt(e))
	p.buf = first
	if len(first) == 1 && first[0] == e.BlockHashes[0] {
		return verdictMismatch, "non_contiguous"
	}
	// Re-chaining from the event's own parent needs nothing prefixd may
	// have missed: once the scheme reproduced some event of the model, a
	// block that does not continue its parent is the engine listing blocks
	// that are not contiguous (llm-d-inference-sim re-storing evicted
	// middle blocks), not a wrong scheme.
	if m.verified.Load() {
		return verdictMismatch, "non_contiguous"
	}
	return verdictMismatch, "chain"
}

// explain says what a mismatch reason means.
func explain(reason string) string {
	switch reason {
	case "root":
		return "a prompt's first blocks differ: the hash seed, the served model name or the LoRA adapter name differs from the engine's"
	case "block_size":
		return "the event's block size differs from the model's (learned from its first full-attention BlockStored event, or configured): a pod or a full-attention KV cache group with another block size cannot be matched"
	case "token_count":
		return "token_ids do not hold block_size tokens per listed block"
	case "non_contiguous":
		return "the event lists a prompt's first block after a parent: its blocks do not continue the parent (llm-d-inference-sim re-stores evicted middle blocks this way)"
	case "chain":
		return "the blocks do not continue the parent, and no event of the model was reproduced yet: the block function (hash scheme) differs from the engine's, or the engine listed blocks that are not contiguous"
	}
	return reason
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// check verifies a BlockStored event and counts the result.
func (m *model) check(ix *Indexer, p *pod, e *events.Event) verdict {
	v, reason := m.verify(p, e)
	switch {
	case v == verdictMatch:
		m.verified.Store(true)
		ix.metrics.hashChecks.WithLabelValues(m.name, "match").Inc()
	case v == verdictMismatch && reason == "non_contiguous":
		// Not a failure of the scheme: the engine listed blocks that do not
		// continue their parent, and their own hashes are right.
		ix.metrics.hashChecks.WithLabelValues(m.name, "non_contiguous").Inc()
	case v == verdictMismatch:
		ix.metrics.hashChecks.WithLabelValues(m.name, "mismatch").Inc()
		ix.metrics.mismatches.WithLabelValues(m.name, reason).Inc()
		if reason == "root" || reason == "block_size" {
			if !m.warnedRoot.Swap(true) {
				ix.log.Warn("engine hashes not reproduced: queries will not match this model's blocks", "model", m.name, "pod", p.name, "reason", explain(reason))
			}
		} else if ix.log.Enabled(context.Background(), slog.LevelDebug) {
			ix.log.Debug("engine hashes not reproduced", "model", m.name, "pod", p.name, "reason", explain(reason))
		}
	}
	return v
}

// applyAuto applies a batch of a model whose key mode is undecided: it
// decides from the batch's BlockStored events when it can, and otherwise
// holds the batch until it can. The decision is recorded in the store,
// where the first process to decide decides for every replica sharing it.
// Locks are taken model first, then pod.
func (ix *Indexer) applyAuto(ctx context.Context, p *pod, b *events.Batch) (Applied, error) {
	m := p.model
	m.mu.Lock()
	defer m.mu.Unlock()
	if mode := m.mode(); mode != KeyModeAuto {
		p.mu.Lock()
		defer p.mu.Unlock()
		return ix.applyLocked(ctx, p, mode, b)
	}
	p.mu.Lock()
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind != events.KindBlockStored {
			continue
		}
		if _, why := p.classify(ix, e); why != keep && why != skipBlockSize {
			continue
		}
		v, reason := m.verify(p, e)
		switch {
		case v == verdictMatch && !e.HasParent:
			m.rootMatches++
			m.verified.Store(true)
		case v == verdictMatch:
			m.chainMatches++
			m.verified.Store(true)
		case v == verdictMismatch && (reason == "root" || reason == "block_size"):
			m.rootMismatches++
			m.lastReason = reason
		}
	}
	p.mu.Unlock()
	var (
		mode KeyMode
		why  string
	)
	switch {
	case m.rootMatches > 0:
		mode = KeyModeEngine
		why = m.opts.HashScheme + " reproduces the engine's block hashes from the model's root"
	case m.rootMismatches >= ix.opts.AutoDecideAfter:
		mode = KeyModeTokens
		why = fmt.Sprintf("%d BlockStored events did not re-chain with %s (%s): queries hashed this way would never match; check the hash scheme, seed, block size and served model name", m.rootMismatches, m.opts.HashScheme, explain(m.lastReason))
	case len(m.pending) >= ix.opts.AutoPendingBatches && m.chainMatches > 0:
		mode = KeyModeEngine
		why = fmt.Sprintf("no event without a parent came in %d batches, but %d events re-chained from their parents: the block function is right, the root (seed, model name) is unverified", len(m.pending), m.chainMatches)
	case len(m.pending) >= ix.opts.AutoPendingBatches:
		mode = KeyModeTokens
		why = fmt.Sprintf("no BlockStored event could be verified in %d batches", len(m.pending))
	default:
		if states, err := ix.store.Models(ctx); err == nil && states[m.name].KeyMode != "" {
			// Another process decided.
			mode, _ = ParseKeyMode(states[m.name].KeyMode)
			why = "decided by another process sharing the store"
			break
		}
		m.pending = append(m.pending, pendingBatch{pod: p, batch: b.Clone()})
		return Applied{Seq: b.Seq, Held: true}, nil
	}
	recorded, err := ix.store.DecideKeyMode(ctx, m.name, mode.String())
	if err != nil {
		m.pending = append(m.pending, pendingBatch{pod: p, batch: b.Clone()})
		return Applied{Seq: b.Seq, Held: true}, nil // decided next time
	}
	if recorded != mode.String() {
		mode, _ = ParseKeyMode(recorded)
		why = "decided by another process sharing the store"
	}
	// Apply what was held, then this batch, and only then publish the mode:
	// until then other pods' applies wait on m.mu, so each pod's order holds.
	pending := m.pending
	m.pending = nil
	var (
		res  Applied
		last error
	)
	for _, pb := range append(pending, pendingBatch{pod: p, batch: b}) {
		pb.pod.mu.Lock()
		r, err := ix.applyLocked(ctx, pb.pod, mode, pb.batch)
		if err != nil && pb.pod != p {
			// The caller was told this batch was applied: its pod's next
			// Apply reports that the store is behind.
			pb.pod.lost = true
		}
		pb.pod.mu.Unlock()
		if pb.pod == p {
			res, last = r, err
		}
	}
	m.decided.Store(uint32(mode))
	ix.metrics.keyMode.WithLabelValues(m.name, KeyModeAuto.String()).Set(0)
	ix.metrics.keyMode.WithLabelValues(m.name, mode.String()).Set(1)
	ix.log.Info("key mode chosen", "model", m.name, "mode", mode.String(), "why", why)
	return res, last
}

// KeyMode returns the key mode a model uses now (auto while undecided).
func (ix *Indexer) KeyMode(modelName string) KeyMode {
	ix.mu.RLock()
	m := ix.models[modelName]
	ix.mu.RUnlock()
	if m == nil {
		return ix.opts.model(modelName).KeyMode
	}
	return m.mode()
}
