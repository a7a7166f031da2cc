package transport

import "time"

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
	// the receiver.
	Frames [][]byte
	// Resync is set on the first message queued after messages of the same
	// connection (Source and Peer) were dropped because the queue was full:
	// whatever the receiver derives from the stream may have missed
	// something before this message.
	Resync bool
}

// size is the total length of the message's frames.
func (m *Message) size() int {
	n := 0
	for _, f := range m.Frames {
		n += len(f)
	}
	return n
}
