package recording

import (
	"bytes"
	"fmt"
	"strconv"
	"time"
)

// Message is one ZMQ message as received, with its frames split into the
// parts a decoder needs. Topic, Seq and Payload are sub-slices of Frames.
type Message struct {
	// Index is the record's position in its file, from 0, counting every
	// record including replay end markers.
	Index int
	// RecvTime is when the subscriber received the message.
	RecvTime time.Time
	// Source is the endpoint the message came from (tcp://10.0.0.7:5557), or
	// empty when the recording does not say.
	Source string
	// Peer is the publisher's address (host:port) when it connected to a
	// socket prefixd bound, which tells apart the publishers behind one
	// Source; empty when unknown.
	Peer string
	// Frames are the message's frames, verbatim.
	Frames [][]byte
	// Topic is empty for publishers without a topic and for replay replies
	// of vLLM <= 0.25.
	Topic   []byte
	Seq     []byte
	Payload []byte
	// Replay is true for a reply to a replay request, false for a message
	// of the live stream.
	Replay bool
}

// replayEndSeq is the seq frame of the message that ends a replay reply.
var replayEndSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// IsReplayEnd reports whether m is the end marker of a replay reply: seq
// 2^64-1 and an empty payload.
func (m *Message) IsReplayEnd() bool {
	return bytes.Equal(m.Seq, replayEndSeq) && len(m.Payload) == 0
}

// Split sets Topic, Seq and Payload as views of Frames, and sets Replay
// for the shapes only replay replies have. It takes
//
//	[topic, seq, payload]        live (topic may be empty); a replay reply of vLLM <= 0.25 when Replay is already set
//	["", topic, seq, payload]    a replay reply read with a DEALER socket
//	[seq, payload]               a replay reply of vLLM <= 0.25 read with a REQ socket
//
// and returns an error wrapping ErrFrames for any other shape, leaving the
// views nil. A 3-frame replay end marker with an empty topic sets Replay.
func (m *Message) Split() error {
	m.Topic, m.Seq, m.Payload = nil, nil, nil
	frames := m.Frames
	switch len(frames) {
	case 2:
		m.Seq, m.Payload, m.Replay = frames[0], frames[1], true
	case 3:
		m.Topic, m.Seq, m.Payload = frames[0], frames[1], frames[2]
		if len(m.Topic) == 0 && m.IsReplayEnd() {
			m.Replay = true
		}
	case 4:
		if len(frames[0]) != 0 {
			return fmt.Errorf("%w: 4 frames whose first is %d bytes, not an empty delimiter", ErrFrames, len(frames[0]))
		}
		m.Topic, m.Seq, m.Payload, m.Replay = frames[1], frames[2], frames[3], true
	default:
		return fmt.Errorf("%w: %s frames, want 2, 3 or 4", ErrFrames, strconv.Itoa(len(frames)))
	}
	return nil
}

// wireFrames returns the frames to record for m: its Frames, or when it
// has none, frames rebuilt from Topic, Seq and Payload.
func (m *Message) wireFrames() [][]byte {
	if m.Frames != nil {
		return m.Frames
	}
	if m.Replay {
		return [][]byte{{}, m.Topic, m.Seq, m.Payload}
	}
	return [][]byte{m.Topic, m.Seq, m.Payload}
}
