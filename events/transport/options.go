package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DefaultTopic is the subscription prefix of llm-d-inference-sim and of vLLM
// as llm-d configures it (kv@<pod>@<model>).
const DefaultTopic = "kv@"

// Options configure a Subscriber. Start from DefaultOptions, change what
// differs, and let NewSubscriber validate the result.
type Options struct {
	// Topic is the subscription prefix sent to every publisher and checked
	// again on every message. The empty string subscribes to everything,
	// which vLLM's default empty topic needs.
	Topic string
	// QueueSize bounds the messages waiting for the consumer. A receive
	// loop never waits for room: a message that finds the queue full is
	// dropped, counted, and the next message of its connection carries
	// Resync.
	QueueSize int
	// MaxFrameBytes is the largest frame accepted. A frame header that
	// announces more closes the connection before anything is allocated.
	MaxFrameBytes int64
	// MaxFrames is the most frames one message may have (live messages
	// have 3, replay replies 4).
	MaxFrames int
	// ReadBufferSize is the size of each connection's read buffer.
	ReadBufferSize int
	// DialTimeout bounds one TCP connect attempt.
	DialTimeout time.Duration
	// HandshakeTimeout bounds the ZMTP greeting and READY exchange.
	HandshakeTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between two connection
	// attempts to one endpoint. The wait doubles after every failure, up
	// to MaxBackoff, with random jitter, and starts again from MinBackoff
	// after a connection that delivered a message.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxPeers bounds the publishers connected at once to one bound
	// address; more are refused and counted.
	MaxPeers int
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns the options prefixd runs with unless told otherwise.
func DefaultOptions() Options {
	return Options{
		Topic:            DefaultTopic,
		QueueSize:        16384,
		MaxFrameBytes:    16 << 20,
		MaxFrames:        8,
		ReadBufferSize:   64 << 10,
		DialTimeout:      5 * time.Second,
		HandshakeTimeout: 5 * time.Second,
		MinBackoff:       100 * time.Millisecond,
		MaxBackoff:       10 * time.Second,
		MaxPeers:         1024,
	}
}

// Validate reports every option that is out of range.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.QueueSize <= 0 {
		bad("queue size must be positive; have %d", o.QueueSize)
	}
	if o.MaxFrameBytes <= 0 {
		bad("max frame bytes must be positive; have %d", o.MaxFrameBytes)
	}
	if o.MaxFrames < 1 {
		bad("max frames must be at least 1; have %d", o.MaxFrames)
	}
	if o.ReadBufferSize < minReadBuffer {
		bad("read buffer size must be at least %d bytes; have %d", minReadBuffer, o.ReadBufferSize)
	}
	if o.DialTimeout <= 0 {
		bad("dial timeout must be positive; have %v", o.DialTimeout)
	}
	if o.HandshakeTimeout <= 0 {
		bad("handshake timeout must be positive; have %v", o.HandshakeTimeout)
	}
	if o.MinBackoff <= 0 {
		bad("min backoff must be positive; have %v", o.MinBackoff)
	}
	if o.MaxBackoff < o.MinBackoff {
		bad("max backoff %v is below min backoff %v", o.MaxBackoff, o.MinBackoff)
	}
	if o.MaxPeers < 1 {
		bad("max peers must be at least 1; have %d", o.MaxPeers)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid transport options: %w", err)
	}
	return nil
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}
