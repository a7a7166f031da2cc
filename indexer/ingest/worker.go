package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
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

// podState is what a worker tracks of one pod.
type podState struct {
	name   string
	source string // transport.Message.Source of the pod's last message
	peer   string // transport.Message.Peer of the last message checked against the topic
	last   uint64 // seq of the last batch applied
	known  bool   // a batch was applied since the pod was seen or reset
}

// run handles the messages of w.in, and runs the functions of w.ctl
// between them, until w.in is closed.
func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	for {
		select {
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
		}
	}
}

// handle applies one message and releases it. A panic while doing so is
// counted and logged; the pod, whose batch may be half applied, is
// marked stale and handled as after a gap by its next batch.
func (w *worker) handle(ctx context.Context, m *transport.Message) {
	defer m.Release()
	var st *podState
	defer func() {
		if r := recover(); r != nil {
			_ = w.p.opts.Recovery.Error(r, "ingest")
			w.p.m.dropped.WithLabelValues(DropPanic, m.Source).Inc()
			if st != nil {
				w.p.ix.SetStale(st.name, true)
				st.known = false
			}
		}
	}()
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
	st, err := w.pod(b, src, m)
	if err != nil {
		w.refused(m, err)
		return
	}
	st.source = m.Source
	name := st.name
	switch {
	case !st.known:
		w.apply(ctx, b, src, name, st)
	case b.Seq <= st.last:
		p.m.resets.WithLabelValues(name).Inc()
		p.log.Info("pod seq went backwards: engine restarted; resetting its blocks", "pod", name, "last_seq", st.last, "seq", b.Seq)
		stale := false
		if err := p.ix.Reset(ctx, name); err != nil {
			stale = true // the old engine's blocks may remain
			p.log.Warn("pod reset failed: pod marked stale", "pod", name, "err", err)
		}
		p.ix.SetStale(name, stale)
		st.known = false
		if m.Resync {
			// Messages were dropped before this one: the new engine's first
			// batches may be among them.
			w.repair(ctx, m, b, src, name, st, 0)
			return
		}
		w.apply(ctx, b, src, name, st)
	case b.Seq > st.last+1 || m.Resync:
		w.repair(ctx, m, b, src, name, st, st.last+1)
	default:
		w.apply(ctx, b, src, name, st)
	}
}

// refused counts and logs, at a bounded rate, a message dropped before it
// reached a pod: a foreign topic or a refusal of the indexer.
func (w *worker) refused(m *transport.Message, err error) {
	p := w.p
	reason := DropForeignTopic
	if !errors.Is(err, errForeignTopic) {
		reason = indexer.RefusedReason(err)
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
		delete(w.pods, name)
		if err := p.ix.RemovePod(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", name, err))
		}
		p.m.forgetPod(name)
		r.pods = append(r.pods, name)
	}
	if len(r.pods) > 0 {
		sweep(w.byTopic, w.pods)
		sweep(w.bySource, w.pods)
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
func (w *worker) pod(b *events.Batch, src indexer.Source, m *transport.Message) (*podState, error) {
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
		if verify && st.peer != m.Peer {
			if !fromPeer(b.Topic, m.Peer) {
				return nil, errForeignTopic
			}
			st.peer = m.Peer
		}
		return st, nil
	}
	if verify && !fromPeer(b.Topic, m.Peer) {
		return nil, errForeignTopic
	}
	name, err := w.p.ix.AdmitPod(b.Topic, rank, src)
	if err != nil {
		return nil, err
	}
	st := w.pods[name]
	if st == nil {
		st = &podState{name: name}
		w.pods[name] = st
	}
	st.peer = m.Peer
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

// repair handles a gap before the live batch b: it replays the pod's
// batches from seq from up to b's, applies them, then applies b.
func (w *worker) repair(ctx context.Context, m *transport.Message, b *events.Batch, src indexer.Source, name string, st *podState, from uint64) {
	p := w.p
	p.m.gaps.WithLabelValues(name).Inc()
	cur := b.Seq
	result := ReplayUnavailable
	ep := p.replayEndpoint(m.Source, name)
	var rerr error
	if ep != "" && p.rp != nil {
		next := from
		complete := true
		rctx, cancel := context.WithTimeout(ctx, p.opts.ReplayTimeout)
		rerr = p.rp.Replay(rctx, ep, from, func(seq uint64, topic, payload []byte) error {
			if seq < next || seq >= cur {
				return nil // not missing, or before what is missing
			}
			if topic == nil {
				topic = b.Topic // a reply without a topic frame is the pod's own
			}
			var seqf [8]byte
			binary.BigEndian.PutUint64(seqf[:], seq)
			rb := &w.rb
			if err := events.Decode(topic, seqf[:], payload, rb); err != nil {
				p.m.decodeErrors.WithLabelValues(ep).Inc()
				p.log.Debug("replayed batch dropped: does not decode", "replay", ep, "seq", seq, "err", err)
				return nil
			}
			if pod, _ := indexer.PodName(rb.Topic, rb.DPRank, src); pod != name {
				return nil // another pod of the same publisher
			}
			if seq > next {
				complete = false
			}
			w.apply(ctx, rb, src, name, st)
			next = seq + 1
			return nil
		})
		cancel()
		switch {
		case rerr != nil:
			result = ReplayError
		case !complete || next < cur:
			result = ReplayIncomplete
		default:
			result = ReplayOK
		}
	}
	p.m.replays.WithLabelValues(name, result).Inc()
	w.apply(ctx, b, src, name, st)
	if result == ReplayOK {
		p.ix.SetStale(name, false)
		p.log.Info("seq gap repaired from replay", "pod", name, "from", from, "seq", cur, "resync", m.Resync)
		return
	}
	p.ix.SetStale(name, true)
	p.log.Warn("seq gap not repaired: pod marked stale", "pod", name, "from", from, "seq", cur,
		"resync", m.Resync, "replay", ep, "result", result, "err", rerr)
}

// apply applies one batch and records its seq.
func (w *worker) apply(ctx context.Context, b *events.Batch, src indexer.Source, name string, st *podState) {
	p := w.p
	if err := p.ix.Apply(ctx, b, src); err != nil {
		p.ix.SetStale(name, true)
		if reason := indexer.RefusedReason(err); reason != "" {
			p.m.dropped.WithLabelValues(reason, st.source).Inc()
			if ok, suppressed := p.refusals.Allow(); ok {
				p.log.Warn("batch refused: pod marked stale", "pod", name, "seq", b.Seq, "reason", reason, "err", err, "refusals_not_logged", suppressed)
			}
		} else {
			p.m.applyErrors.WithLabelValues(name).Inc()
			p.log.Warn("batch not applied: pod marked stale", "pod", name, "seq", b.Seq, "err", err)
		}
	}
	st.last, st.known = b.Seq, true
	p.m.batches.Inc()
	p.applied.Add(1)
	p.appliedEvents.Add(uint64(len(b.Events)))
	if b.TS > 0 {
		lag := time.Since(time.Unix(0, int64(b.TS*1e9))).Seconds()
		p.m.lag.Observe(max(lag, 0))
	}
}
