package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
				continue // shutting down: drain without applying
			}
			w.handle(ctx, &m)
		case f := <-w.ctl:
			f()
		}
	}
}

func (w *worker) handle(ctx context.Context, m *transport.Message) {
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
	st := w.pod(b, src)
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

// pod returns the state of the pod of batch b from source src.
func (w *worker) pod(b *events.Batch, src indexer.Source) *podState {
	_, _, byTopic := events.ParseTopic(b.Topic)
	var ranks []*podState
	if byTopic {
		ranks = w.byTopic[string(b.Topic)] // no allocation: map index by converted bytes
	} else {
		ranks = w.bySource[src.Pod]
	}
	rank := b.DPRank
	if rank >= 0 && rank < len(ranks) && ranks[rank] != nil {
		return ranks[rank]
	}
	name, _ := indexer.PodName(b.Topic, rank, src)
	st := w.pods[name]
	if st == nil {
		st = &podState{name: name}
		w.pods[name] = st
	}
	if rank >= 0 && rank < maxCachedRank {
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
	return st
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
		p.m.applyErrors.WithLabelValues(name).Inc()
		p.ix.SetStale(name, true)
		p.log.Warn("batch not applied: pod marked stale", "pod", name, "seq", b.Seq, "err", err)
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
