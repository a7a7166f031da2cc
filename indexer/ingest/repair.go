package ingest

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/indexer"
)

// Gaps are repaired from the pod's replay endpoint: a gap in the live
// stream (repair), and the batches of a pod left to another replica's
// lease when that replica stopped applying them (takeOver).

// repair handles a gap before the live batch b: it replays the pod's
// batches from seq from up to b's, applies them, then applies b. With
// fromFirst the pod has no history, and from is 0: a run of replayed
// batches starting at 0 or 1 is complete.
func (w *worker) repair(ctx context.Context, m *transport.Message, b *events.Batch, src indexer.Source, st *podState, from uint64, fromFirst bool) {
	p := w.p
	ep := p.replayEndpoint(m.Source, st.name)
	tried := time.Now()
	result, rerr := w.replay(ctx, ep, b.Topic, src, st, from, b.Seq, fromFirst)
	if err := w.apply(ctx, b, src, st); err != nil && result == ReplayOK {
		result = ReplayIncomplete
	}
	if st.hasLeft && !st.leftAt.Before(tried) {
		return // the batches are another replica's, which holds the pod's lease
	}
	w.repaired(ctx, st, ep, from, b.Seq, m.Resync, result, rerr)
}

// repaired counts and logs a gap repair, and marks the pod consistent or
// stale by its result.
func (w *worker) repaired(ctx context.Context, st *podState, ep string, from, cur uint64, resync bool, result string, rerr error) {
	p := w.p
	p.m.gaps.WithLabelValues(st.name).Inc()
	p.m.replays.WithLabelValues(st.name, result).Inc()
	if result == ReplayOK {
		w.stale(ctx, st, false)
		p.log.Info("seq gap repaired from replay", "pod", st.name, "from", from, "seq", cur, "resync", resync)
		return
	}
	w.stale(ctx, st, true)
	p.log.Warn("seq gap not repaired: pod marked stale", "pod", st.name, "from", from, "seq", cur,
		"resync", resync, "replay", ep, "result", result, "err", rerr)
}

// replay asks replay endpoint ep for pod st's batches from seq from and
// applies those before cur, and says whether it got all of them. topic is
// the pod's, for replies without a topic frame. With fromFirst the pod
// has no history, and from is 0: a run starting at 0 or 1 is complete.
func (w *worker) replay(ctx context.Context, ep string, topic []byte, src indexer.Source, st *podState, from, cur uint64, fromFirst bool) (string, error) {
	p := w.p
	if ep == "" || p.rp == nil {
		return ReplayUnavailable, nil
	}
	name := st.name
	started := !fromFirst
	next, complete := from, true
	rctx, cancel := context.WithTimeout(ctx, p.opts.ReplayTimeout)
	defer cancel()
	rerr := p.rp.Replay(rctx, ep, from, func(seq uint64, rtopic, payload []byte) error {
		if seq < next || seq >= cur {
			return nil // not missing, or before what is missing
		}
		if rtopic == nil {
			rtopic = topic // a reply without a topic frame is the pod's own
		}
		var seqf [8]byte
		binary.BigEndian.PutUint64(seqf[:], seq)
		rb := &w.rb
		if err := events.Decode(rtopic, seqf[:], payload, rb); err != nil {
			p.m.decodeErrors.WithLabelValues(ep).Inc()
			p.log.Debug("replayed batch dropped: does not decode", "replay", ep, "seq", seq, "err", err)
			return nil
		}
		if pod, _ := p.ix.PodName(rb.Topic, rb.DPRank, src); pod != name {
			return nil // another pod of the same publisher
		}
		if started && seq > next || !started && seq > 1 {
			complete = false
		}
		started = true
		if err := w.apply(ctx, rb, src, st); err != nil {
			complete = false
		}
		next = seq + 1
		return nil
	})
	switch {
	case rerr != nil:
		return ReplayError, rerr
	case !complete || started && next < cur || !started && cur > 1:
		return ReplayIncomplete, nil
	}
	return ReplayOK, nil
}

// takeOverAfter is how long a pod whose batch was left to another replica
// stays quiet before this one tries to take its stream over.
const takeOverAfter = time.Second

// takeOver tries, for each pod whose last batch was left to another
// replica and which has been quiet since, to apply the batches up to it
// from the pod's replay endpoint: the replica holding the pod's lease
// applied them (nothing to do), or it stopped receiving them (the
// publisher reconnected to this replica) and its lease lapsed, and this
// replica takes the stream over. While the lease holds, it waits.
func (w *worker) takeOver(ctx context.Context, now time.Time) {
	p := w.p
	for _, st := range w.pods {
		if !st.hasLeft || now.Sub(st.leftAt) < takeOverAfter {
			continue
		}
		seq, ok, err := p.ix.AppliedSeq(ctx, st.name)
		if err != nil {
			continue
		}
		st.applied, st.hasApplied, st.loaded = seq, ok, true
		if ok && seq >= st.left {
			st.hasLeft = false // the lease holder applied it
			continue
		}
		ep := p.replayEndpoint(st.source, st.name)
		if ep == "" || p.rp == nil {
			// Nothing to take over from: the pod's next batch will.
			st.hasLeft = false
			continue
		}
		from, first := seq+1, !ok
		if first {
			from = 0
		}
		tried := st.leftAt
		result, rerr := w.replay(ctx, ep, st.leftTopic, st.leftSrc, st, from, st.left+1, first)
		if st.leftAt.After(tried) {
			continue // still another replica's lease: tried again later
		}
		st.hasLeft = false
		w.repaired(ctx, st, ep, from, st.left, false, result, rerr)
	}
}
