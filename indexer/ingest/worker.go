package ingest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/store"
)

// worker applies the batches of the pods that route to it. Everything in
// it is owned by its goroutine.
type worker struct {
	p  *Pipeline
	in chan transport.Message
	// ctl carries functions to run between messages, on the worker's
	// goroutine, so they may use its state (RemoveSource).
	ctl  chan func()
	done chan struct{}        // closed when run returns
	pods map[string]*podState // by pod name
	// byTopic and bySource find a pod's state without building its name:
	// by topic for kv@ topics, by source name otherwise, then by rank.
	byTopic  map[string][]*podState
	bySource map[string][]*podState
	b        events.Batch // the live batch, reused
	rb       events.Batch // a replayed batch, reused
}

// podState is what a worker tracks of one pod. The pod's applied seq is
// the store's; applied mirrors it, read from the store when the pod is
// first seen (a restarted process, another replica) and kept from what
// every Apply reports.
type podState struct {
	name   string
	source string // transport.Message.Source of the pod's last message
	peer   string // transport.Message.Peer of the pod's last message
	// seen is the seq of the pod's last live batch this process received,
	// when hasSeen: the pod's stream as this replica sees it, which may
	// trail the applied seq another replica sharing the store recorded.
	seen    uint64
	hasSeen bool
	// checked is the peer last found to be at the address the topic names.
	checked    string
	loaded     bool   // applied and hasApplied were read from the store
	applied    uint64 // the store's applied seq, when hasApplied
	hasApplied bool
	// suspect is set when the pod's connection closed: what its publisher
	// published until it was connected again is lost, so the pod is stale
	// until its next batch shows that its seq continued (or a replay
	// fills the gap).
	suspect bool
	// gone is when the pod's connection closed, zero while connected: a
	// pod gone for Options.PodTimeout leaves the index.
	gone time.Time
	// unsynced is set when the store failed to record the pod's stale mark
	// (wantStale): it is recorded again every second until it is.
	unsynced, wantStale bool
	// left is the seq of the pod's last batch left to another replica
	// holding the pod's write lease, at leftAt, when hasLeft; leftTopic
	// and leftSrc are its topic and source. Should the pod go quiet, the
	// batches up to it are taken over from replay once that lease lapses
	// (takeOver).
	left      uint64
	leftAt    time.Time
	leftTopic []byte
	leftSrc   indexer.Source
	hasLeft   bool
}

// run handles the messages of w.in, runs the functions of w.ctl between
// them, and removes the pods gone for the pod timeout, until w.in is
// closed.
func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	var expire <-chan time.Time
	if t := w.p.opts.PodTimeout; t > 0 {
		tick := time.NewTicker(min(max(t/4, time.Second), 30*time.Second))
		defer tick.Stop()
		expire = tick.C
	}
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case now := <-retry.C:
			w.resyncStale(ctx)
			w.takeOver(ctx, now)
		case m, ok := <-w.in:
			if !ok {
				return
			}
			if ctx.Err() != nil {
				m.Release()
				continue // shutting down: drain without applying
			}
			w.handle(ctx, &m)
		case f := <-w.ctl:
			f()
		case now := <-expire:
			w.expire(ctx, now)
		}
	}
}

// handle applies one message and releases it. A panic while doing so is
// counted and logged; the pod, whose batch may be half applied, is
// marked stale and its applied seq read again from the store.
func (w *worker) handle(ctx context.Context, m *transport.Message) {
	defer m.Release()
	var st *podState
	defer func() {
		if r := recover(); r != nil {
			_ = w.p.opts.Recovery.Error(r, "ingest")
			w.p.m.dropped.WithLabelValues(DropPanic, m.Source).Inc()
			if st != nil {
				w.stale(ctx, st, true)
				st.loaded = false
			}
		}
	}()
	if m.Closed {
		w.closed(ctx, m)
		return
	}
	p := w.p
	src, ok := p.source(m)
	if !ok {
		p.m.dropped.WithLabelValues(DropSourceRemoved, m.Source).Inc()
		return
	}
	b := &w.b
	if err := events.DecodeFrames(m.Frames, b); err != nil {
		p.m.decodeErrors.WithLabelValues(m.Source).Inc()
		p.log.Debug("kv event message dropped: does not decode", "source", m.Source, "peer", m.Peer, "err", err)
		return
	}
	st, err := w.pod(ctx, b, src, m)
	if err != nil {
		w.refused(m, err)
		return
	}
	st.source, st.peer, st.gone = m.Source, m.Peer, time.Time{}
	if !st.loaded {
		seq, ok, err := p.ix.AppliedSeq(ctx, st.name)
		if errors.Is(err, store.ErrUnavailable) {
			w.unavailable(ctx, st, err)
			return
		}
		if err != nil {
			p.log.Warn("applied seq not read from the store: handled as a gap", "pod", st.name, "err", err)
			w.repair(ctx, m, b, src, st, st.applied+1, false)
			return
		}
		st.applied, st.hasApplied, st.loaded = seq, ok, true
	}
	w.step(ctx, m, b, src, st)
	st.seen, st.hasSeen = b.Seq, true
}

// step applies batch b of a pod after what its seq says of the ones
// before it.
func (w *worker) step(ctx context.Context, m *transport.Message, b *events.Batch, src indexer.Source, st *podState) {
	p := w.p
	switch {
	case !st.hasApplied:
		w.first(ctx, m, b, src, st)
	case b.Seq == st.applied:
		p.m.duplicates.Inc()
	case b.Seq < st.applied && st.hasSeen && b.Seq > st.seen:
		// This replica's view of the stream moves on, behind what
		// another replica sharing the store applied: not a restart.
		p.m.duplicates.Inc()
	case b.Seq < st.applied:
		p.m.resets.WithLabelValues(st.name).Inc()
		p.log.Info("pod seq went backwards: engine restarted; resetting its blocks", "pod", st.name, "last_seq", st.applied, "seq", b.Seq)
		if err := p.ix.Reset(ctx, st.name); errors.Is(err, store.ErrNotOwner) {
			// The replica holding the pod's lease resets it.
			p.m.notOwner.Inc()
			st.loaded = false
			return
		} else if err != nil {
			p.log.Warn("pod reset failed: pod marked stale", "pod", st.name, "err", err)
			w.stale(ctx, st, true)
			st.loaded = false
			return
		}
		st.applied, st.hasApplied, st.suspect = 0, false, false
		w.first(ctx, m, b, src, st)
	case b.Seq > st.applied+1 || m.Resync:
		w.repair(ctx, m, b, src, st, st.applied+1, false)
	default:
		if err := w.apply(ctx, b, src, st); err != nil {
			if retryable(err) {
				// Failures are gaps: applied again from the applied seq.
				w.repair(ctx, m, b, src, st, st.applied+1, false)
			}
			return
		}
		if st.suspect {
			p.log.Info("pod's seq continued after its connection closed: nothing was missed", "pod", st.name, "seq", b.Seq)
			w.stale(ctx, st, false)
		}
	}
}

// first applies the first batch of a pod without history: new, restarted,
// or seen first after its publisher started (a late subscriber, a
// restarted prefixd). Unless the batch is a publisher's first (seq 0,
// vLLM's, or 1, llm-d-inference-sim's), what came before it was missed:
// it is asked of the replay endpoint, and without one the pod is stale.
// (A vLLM seen first at seq 1 missed its seq 0 unnoticed.)
func (w *worker) first(ctx context.Context, m *transport.Message, b *events.Batch, src indexer.Source, st *podState) {
	p := w.p
	if b.Seq > 1 && p.rp != nil && p.replayEndpoint(m.Source, st.name) != "" {
		w.repair(ctx, m, b, src, st, 0, true)
		return
	}
	if err := w.apply(ctx, b, src, st); err != nil {
		if retryable(err) {
			w.repair(ctx, m, b, src, st, 0, true)
		}
		return
	}
	if b.Seq > 1 {
		p.m.gaps.WithLabelValues(st.name).Inc()
		p.m.replays.WithLabelValues(st.name, ReplayUnavailable).Inc()
		p.log.Warn("first batch of a pod comes after its publisher's first, and no replay endpoint is known: pod marked stale",
			"pod", st.name, "seq", b.Seq)
		w.stale(ctx, st, true)
		return
	}
	w.stale(ctx, st, false)
}

// apply applies one batch and keeps the applied seq the indexer reports.
// On a refusal the pod is marked stale (a batch of it is missing); on any
// other error the applied seq is read again from the store before the
// pod's next batch.
func (w *worker) apply(ctx context.Context, b *events.Batch, src indexer.Source, st *podState) error {
	p := w.p
	res, err := p.ix.Apply(ctx, b, src)
	switch {
	case errors.Is(err, store.ErrNotOwner):
		// Another replica applies the pod's stream; this one takes over
		// once that replica's lease lapses, from the store's applied seq.
		p.m.notOwner.Inc()
		st.loaded = false
		if !st.hasLeft || b.Seq >= st.left {
			st.left, st.leftTopic, st.leftSrc, st.hasLeft = b.Seq, append(st.leftTopic[:0], b.Topic...), src, true
		}
		st.leftAt = time.Now()
		return err
	case errors.Is(err, store.ErrUnavailable):
		w.unavailable(ctx, st, err)
		return err
	}
	if err != nil {
		w.stale(ctx, st, true)
		if reason := indexer.RefusedReason(err); reason != "" {
			p.m.dropped.WithLabelValues(reason, st.source).Inc()
			if ok, suppressed := p.refusals.Allow(); ok {
				p.log.Warn("batch refused: pod marked stale", "pod", st.name, "seq", b.Seq, "reason", reason, "err", err, "refusals_not_logged", suppressed)
			}
			return err
		}
		p.m.applyErrors.WithLabelValues(st.name).Inc()
		st.loaded = false
		if ok, suppressed := p.refusals.Allow(); ok {
			p.log.Warn("batch not applied: applied again from the store's applied seq", "pod", st.name, "seq", b.Seq, "err", err, "failures_not_logged", suppressed)
		}
		return err
	}
	st.applied, st.hasApplied = res.Seq, true
	if st.hasLeft && res.Seq >= st.left {
		st.hasLeft = false
	}
	if res.Duplicate {
		p.m.duplicates.Inc()
		return nil
	}
	p.m.batches.Inc()
	p.applied.Add(1)
	p.appliedEvents.Add(uint64(len(b.Events)))
	if b.TS > 0 {
		lag := time.Since(time.Unix(0, int64(b.TS*1e9))).Seconds()
		p.m.lag.Observe(max(lag, 0))
	}
	return nil
}

// retryable reports whether a batch that failed to apply may apply when
// tried again at once, from replay: not a refusal, which is the batch's
// own, nor a batch another replica applies, nor a store that cannot be
// reached (the gap is repaired once it is back).
func retryable(err error) bool {
	return indexer.RefusedReason(err) == "" && !errors.Is(err, store.ErrNotOwner) && !errors.Is(err, store.ErrUnavailable)
}

// unavailable drops a batch of pod st because the store cannot be
// reached: the pod is stale, and its applied seq is read again once the
// store is back, so that its next batch finds the gap and repairs it.
func (w *worker) unavailable(ctx context.Context, st *podState, err error) {
	p := w.p
	p.m.dropped.WithLabelValues(DropStoreUnavailable, st.source).Inc()
	st.loaded = false
	w.stale(ctx, st, true)
	if ok, suppressed := p.refusals.Allow(); ok {
		p.log.Warn("store unavailable: batch dropped, pod marked stale until the store is back and its gap repaired", "pod", st.name, "err", err, "failures_not_logged", suppressed)
	}
}

// stale marks a pod stale or consistent again, in the index and here.
func (w *worker) stale(ctx context.Context, st *podState, stale bool) {
	if !stale {
		st.suspect = false
	}
	st.unsynced, st.wantStale = false, stale
	if err := w.p.ix.SetStale(ctx, st.name, stale); err != nil {
		st.unsynced = true
		w.p.log.Warn("stale mark not recorded: recorded again once the store takes it", "pod", st.name, "stale", stale, "err", err)
	}
}

// resyncStale records again the stale marks the store failed to take (it
// was unreachable), so that a pod whose batch was dropped is stale in the
// store for every replica even when no later batch of it comes.
func (w *worker) resyncStale(ctx context.Context) {
	for _, st := range w.pods {
		if st.unsynced && w.p.ix.SetStale(ctx, st.name, st.wantStale) == nil {
			st.unsynced = false
		}
	}
}

// closed marks the pods last seen on a connection that ended as suspect
// and stale, and starts their pod timeout.
func (w *worker) closed(ctx context.Context, m *transport.Message) {
	now := time.Now()
	for _, st := range w.pods {
		if st.source != m.Source || st.peer != m.Peer {
			continue
		}
		st.gone = now
		if st.hasLeft {
			// Another replica holds the pod's lease and applies its
			// stream over its own connection: the pod's stale mark in
			// the shared store is that replica's to set.
			w.p.log.Info("publisher connection closed; the pod's stale mark is left to the replica holding its lease",
				"pod", st.name, "source", m.Source, "peer", m.Peer)
			continue
		}
		st.suspect = true
		w.stale(ctx, st, true)
		w.p.log.Info("publisher connection closed: pod stale until its next batch shows that nothing was missed",
			"pod", st.name, "source", m.Source, "peer", m.Peer)
	}
}

// expire removes the pods whose connection closed a pod timeout ago and
// did not come back.
func (w *worker) expire(ctx context.Context, now time.Time) {
	p := w.p
	var gone []string
	for name, st := range w.pods {
		if !st.gone.IsZero() && now.Sub(st.gone) >= p.opts.PodTimeout {
			gone = append(gone, name)
		}
	}
	for _, name := range gone {
		w.forget(name)
		// Counted first, so that whoever sees the pod gone sees it counted.
		p.m.podsRemoved.WithLabelValues(RemovedTimeout).Inc()
		if err := p.ix.RemovePod(ctx, name); err != nil {
			p.log.Warn("pod not removed from the index", "pod", name, "err", err)
		}
		p.log.Info("pod left: its connection closed and did not come back within the pod timeout", "pod", name, "pod_timeout", p.opts.PodTimeout)
	}
}

// forget drops a pod's state and series here.
func (w *worker) forget(name string) {
	delete(w.pods, name)
	w.p.m.forgetPod(name)
	sweep(w.byTopic, w.pods)
	sweep(w.bySource, w.pods)
}

// refused counts and logs, at a bounded rate, a message dropped before it
// reached a pod: a foreign topic or a refusal of the indexer.
func (w *worker) refused(m *transport.Message, err error) {
	p := w.p
	reason := DropForeignTopic
	if !errors.Is(err, errForeignTopic) {
		reason = indexer.RefusedReason(err)
	}
	if reason == "" {
		reason = DropError
	}
	p.m.dropped.WithLabelValues(reason, m.Source).Inc()
	if ok, suppressed := p.refusals.Allow(); ok {
		p.log.Warn("kv event message refused", "reason", reason, "source", m.Source, "peer", m.Peer, "err", err, "refusals_not_logged", suppressed)
	}
}

// errForeignTopic is returned by worker.pod for a message whose topic names
// a pod at another address than the publisher's.
var errForeignTopic = errors.New("the topic names a pod at another address than the publisher's source address (--zmq-trust-topics accepts it)")

// fromPeer reports whether a kv@ topic's pod (IP:PORT or [IP]:PORT) has
// the address of peer (the connection's remote IP:PORT) as its host.
// Topics that name no pod are the peer's own.
func fromPeer(topic []byte, peer string) bool {
	pod, _, ok := events.ParseTopic(topic)
	if !ok {
		return true
	}
	pa, err := netip.ParseAddrPort(peer)
	if err != nil {
		return false
	}
	host, _, err := net.SplitHostPort(string(pod))
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap() == pa.Addr().Unmap()
}

// removal is what one worker removed for RemoveSource.
type removal struct {
	pods []string
	err  error
}

// removeSource forgets the pods last seen from source: their blocks in the
// index, their state and their series of the pipeline's metrics.
func (w *worker) removeSource(ctx context.Context, source string) removal {
	p := w.p
	var (
		r    removal
		errs []error
	)
	for name, st := range w.pods {
		if st.source != source {
			continue
		}
		p.m.podsRemoved.WithLabelValues(RemovedSource).Inc() // before, as expire does
		if err := p.ix.RemovePod(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", name, err))
		}
		r.pods = append(r.pods, name)
	}
	for _, name := range r.pods {
		w.forget(name)
	}
	r.err = errors.Join(errs...)
	return r
}

// sweep takes out of a rank cache the states that pods no longer holds.
func sweep(cache map[string][]*podState, pods map[string]*podState) {
	for key, ranks := range cache {
		live := false
		for i, st := range ranks {
			switch {
			case st == nil:
			case pods[st.name] != st:
				ranks[i] = nil
			default:
				live = true
			}
		}
		if !live {
			delete(cache, key)
		}
	}
}

// maxCachedRank bounds the data-parallel ranks whose state is found
// without building the pod's name.
const maxCachedRank = 64

// maxCachedTopics bounds a worker's byTopic entries: topics are the
// publishers' to choose.
const maxCachedTopics = 4096

// pod returns the state of the pod of batch b, message m, from source src.
// A pod new to the worker is admitted by the indexer first, so that no
// state is kept for a pod it refuses. Unless Options.TrustTopics, a
// message that reached a bound address must come from the address its
// topic names (errForeignTopic).
func (w *worker) pod(ctx context.Context, b *events.Batch, src indexer.Source, m *transport.Message) (*podState, error) {
	verify := m.Inbound && !w.p.opts.TrustTopics
	_, _, byTopic := events.ParseTopic(b.Topic)
	var ranks []*podState
	if byTopic {
		ranks = w.byTopic[string(b.Topic)] // no allocation: map index by converted bytes
	} else {
		ranks = w.bySource[src.Pod]
	}
	rank := b.DPRank
	if rank >= 0 && rank < len(ranks) && ranks[rank] != nil {
		st := ranks[rank]
		if verify && st.checked != m.Peer {
			if !fromPeer(b.Topic, m.Peer) {
				return nil, errForeignTopic
			}
			st.checked = m.Peer
		}
		return st, nil
	}
	if verify && !fromPeer(b.Topic, m.Peer) {
		return nil, errForeignTopic
	}
	name, displaced, err := w.p.ix.AdmitPod(ctx, b.Topic, rank, src)
	if displaced != "" {
		w.forget(displaced)
		ranks = w.byTopic[string(b.Topic)]
	}
	if err != nil {
		return nil, err
	}
	st := w.pods[name]
	if st == nil {
		st = &podState{name: name}
		w.pods[name] = st
	}
	st.checked = m.Peer
	if rank >= 0 && rank < maxCachedRank && (!byTopic || ranks != nil || len(w.byTopic) < maxCachedTopics) {
		if rank >= len(ranks) {
			ranks = append(ranks, make([]*podState, rank+1-len(ranks))...)
		}
		ranks[rank] = st
		if byTopic {
			w.byTopic[string(b.Topic)] = ranks
		} else {
			w.bySource[src.Pod] = ranks
		}
	}
	return st, nil
}
