package transport

import (
	"sync/atomic"
	"time"
)

// Message is one ZeroMQ message as it came off the wire.
type Message struct {
	// Source is the endpoint the message came from: the endpoint connected
	// to, or the address bound (as Bind returned it) for publishers that
	// connected to prefixd.
	Source string
	// Peer is the publisher's network address (host:port), which tells
	// apart the publishers connected to one bound address.
	Peer string
	// RecvTime is when the message was read.
	RecvTime time.Time
	// Frames are the message's frames, verbatim: [topic, seq, payload] for
	// a KV event publisher. They are allocated per message and belong to
	// the receiver until it calls Release.
	Frames [][]byte
	// Resync is set on the first message queued after messages of the same
	// connection (Source and Peer; for a connected endpoint, any of its
	// connections) were dropped because the queue was full or the memory
	// budget could not hold them: whatever the receiver derives from the
	// stream may have missed something before this message.
	Resync bool
	// Inbound is set for messages of a publisher that connected to an
	// address the Subscriber binds. Whoever reaches that port can be such
	// a publisher, so what its topic claims is only as good as its source
	// address (Peer).
	Inbound bool
	// Closed marks a notice, with no Frames, that the connection of Source
	// and Peer has ended, queued once for every connection that delivered
	// a message. Publishers drop what they publish while no subscriber is
	// connected, so the receiver must treat the connection's pods as
	// possibly behind until their next batch, or a replay, shows that
	// nothing was missed. A notice is never dropped for a full queue: the
	// connection's goroutine waits for room, or for Close.
	Closed bool

	lease *lease // the bytes of Frames, counted in the Subscriber's memory budget
}

// Release returns the message's bytes to the Subscriber's memory budget:
// the receiver calls it once it no longer uses Frames, and must not use
// them after. A receiver that keeps messages without releasing them ends
// up with every new message dropped for lack of memory. Calling Release
// again, or on a message no Subscriber queued, does nothing.
func (m *Message) Release() {
	if m.lease != nil {
		m.lease.release()
	}
}

// lease is a message's share of a memory budget, given back once.
type lease struct {
	b    *budget
	n    int64
	done atomic.Bool
}

func (l *lease) release() {
	if !l.done.Swap(true) {
		l.b.release(l.n)
	}
}

// leaseSlab is how many leases are allocated at once: one allocation per
// message showed as a few percent of the receive loop's CPU profile, with
// the GC work it brings. A lease is never reused, so a slab (3 KiB) lives
// on while any message of it does.
const leaseSlab = 128

// leases hands out leases from slabs; it belongs to one goroutine.
type leases struct {
	slab []lease
}

// take returns a lease of n bytes of b.
func (ls *leases) take(b *budget, n int64) *lease {
	if len(ls.slab) == 0 {
		ls.slab = make([]lease, leaseSlab)
	}
	l := &ls.slab[0]
	ls.slab = ls.slab[1:]
	l.b, l.n = b, n
	return l
}

// budget bounds the bytes of messages being assembled or waiting for their
// receiver, across every connection of a Subscriber.
type budget struct {
	limit int64
	used  atomic.Int64
}

// reserve takes n bytes and reports whether they fit under the limit.
func (b *budget) reserve(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *budget) release(n int64) { b.used.Add(-n) }
