package transport

import "errors"

// Sentinel errors. Errors returned by this package wrap one of them where it
// applies; check with errors.Is.
var (
	// ErrClosed: the Subscriber was closed.
	ErrClosed = errors.New("transport: subscriber closed")
	// ErrEndpoint: an endpoint string is not tcp://host:port or ipc://path.
	ErrEndpoint = errors.New("transport: invalid endpoint")
	// ErrFrameTooLarge: a frame header announced more than MaxFrameBytes.
	// The connection is closed before the frame is read.
	ErrFrameTooLarge = errors.New("transport: frame too large")
	// ErrMessageTooLarge: the frames of one message announced more than
	// MaxFrameBytes plus 64 KiB together. The connection is closed before
	// the frame that went over is read.
	ErrMessageTooLarge = errors.New("transport: message too large")
	// ErrMemory: a frame did not fit in the memory budget
	// (MaxBufferedBytes). A message frame is read past and its message
	// dropped, on a Subscriber's connection; a command frame, or any frame
	// of a replay, ends the connection or the replay.
	ErrMemory = errors.New("transport: memory budget exhausted")
	// ErrSlowMessage: a message was not complete MessageTimeout after its
	// first byte arrived. The connection is closed.
	ErrSlowMessage = errors.New("transport: message too slow")
	// ErrProtocol: the peer broke ZMTP framing (reserved flag bits, a
	// command inside a multipart message, too many frames in a message, a
	// handshake zmq4 could not complete).
	ErrProtocol = errors.New("transport: zmtp protocol error")
	// ErrReplyShape: a replay reply is not ["", topic, seq, payload] or
	// ["", seq, payload].
	ErrReplyShape = errors.New("transport: malformed replay reply")
	// ErrReplayIncomplete: the replay connection ended before the end
	// marker (seq 2^64-1) arrived.
	ErrReplayIncomplete = errors.New("transport: replay ended before its end marker")
)
