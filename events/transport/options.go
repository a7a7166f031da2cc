package transport

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prefixd/prefixd/internal/recovery"
)

// DefaultTopic is the subscription prefix of llm-d-inference-sim and of vLLM
// as llm-d configures it (kv@<pod>@<model>).
const DefaultTopic = "kv@"

// messageAllowance is what a message may hold beyond MaxFrameBytes, for
// its topic, seq and replay delimiter frames.
const messageAllowance = 64 << 10

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
	// MaxBufferedBytes bounds the frame bytes held across every connection:
	// those of messages being received and those of messages queued and
	// not yet released (Message.Release). Each frame is counted from the
	// moment its header arrives, before it is allocated. A message frame
	// that does not fit is read past without being stored, its message
	// dropped (reason "memory") and the connection's next queued message
	// flagged Resync; the connection stays up. It must hold at least one
	// message of the largest size accepted (MaxFrameBytes + 64 KiB).
	MaxBufferedBytes int64
	// MaxFrameBytes is the largest frame accepted. A frame header that
	// announces more closes the connection before anything is allocated.
	// The frames of one message together may have at most MaxFrameBytes
	// plus 64 KiB (for the topic and seq); a message that announces more
	// closes the connection too.
	MaxFrameBytes int64
	// MaxFrames is the most frames one message may have (live messages
	// have 3, replay replies 4).
	MaxFrames int
	// ReadBufferSize is the size of each connection's read buffer.
	ReadBufferSize int
	// DialTimeout bounds one TCP connect attempt.
	DialTimeout time.Duration
	// HandshakeTimeout bounds the ZMTP greeting and READY exchange of
	// every connection, from the moment it is accepted or dialled, so it
	// also ends peers that never send a byte.
	HandshakeTimeout time.Duration
	// MessageTimeout bounds how long a message may take to arrive once its
	// first byte has: a connection that leaves a message unfinished for
	// longer is closed (reason "slow_message"). It also bounds each write
	// after the handshake (the PONGs a PING asks for). Idle connections,
	// between messages, are not timed.
	MessageTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between two connection
	// attempts to one endpoint. The wait doubles after every failure, up
	// to MaxBackoff, with random jitter, and starts again from MinBackoff
	// after a connection that delivered a message.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxPeers bounds the publishers connected at once to one bound
	// address; more are refused and counted (reason "too_many").
	MaxPeers int
	// MaxConnsPerHost bounds the connections open at once to one bound
	// address from one source IP address, handshakes included; more are
	// refused and counted (reason "too_many_from_host"). Unix socket peers
	// are bounded by MaxPeers only.
	MaxConnsPerHost int
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
	// Recovery counts and logs a panic in a connection's goroutine
	// (prefixd_panics_total{where="zmq_connection"}) or in a replay
	// (where="zmq_replay"), which then ends that connection or replay
	// alone; nil logs to slog.Default() and counts nothing.
	Recovery *recovery.Guard
}

// DefaultOptions returns the options prefixd runs with unless told otherwise.
func DefaultOptions() Options {
	return Options{
		Topic:            DefaultTopic,
		QueueSize:        16384,
		MaxBufferedBytes: 256 << 20,
		MaxFrameBytes:    16 << 20,
		MaxFrames:        8,
		ReadBufferSize:   64 << 10,
		DialTimeout:      5 * time.Second,
		HandshakeTimeout: 10 * time.Second,
		MessageTimeout:   10 * time.Second,
		MinBackoff:       100 * time.Millisecond,
		MaxBackoff:       10 * time.Second,
		MaxPeers:         1024,
		MaxConnsPerHost:  128,
	}
}

// AddFlags registers the options' limits on fs, with DefaultOptions'
// values as defaults. Validate checks them after parsing.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	d := DefaultOptions()
	fs.Int64Var(&o.MaxBufferedBytes, "zmq-max-buffered-bytes", d.MaxBufferedBytes,
		"most frame bytes held across every ZeroMQ connection, received or queued for the index;\na message that does not fit is dropped (prefixd_ingest_dropped_total{reason=\"memory\"})")
	fs.DurationVar(&o.MessageTimeout, "zmq-message-timeout", d.MessageTimeout,
		"close a ZeroMQ connection that leaves a message unfinished this long")
	fs.DurationVar(&o.HandshakeTimeout, "zmq-handshake-timeout", d.HandshakeTimeout,
		"close a ZeroMQ connection that has not completed its handshake this long after it opened")
	fs.IntVar(&o.MaxConnsPerHost, "zmq-max-conns-per-host", d.MaxConnsPerHost,
		"most connections to one bound ZeroMQ address from one source IP address")
	fs.IntVar(&o.MaxPeers, "zmq-max-peers", d.MaxPeers, "most publishers connected to one bound ZeroMQ address")
	fs.Int64Var(&o.MaxFrameBytes, "zmq-max-frame-bytes", d.MaxFrameBytes,
		"largest ZeroMQ frame accepted; a message's frames together may have 64 KiB more")
	fs.IntVar(&o.QueueSize, "zmq-queue-size", d.QueueSize, "messages received and waiting for the index")
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
	} else if o.MaxBufferedBytes < o.maxMessageBytes() {
		bad("max buffered bytes must hold the largest message, %d bytes (max frame bytes + %d); have %d",
			o.maxMessageBytes(), messageAllowance, o.MaxBufferedBytes)
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
	if o.MessageTimeout <= 0 {
		bad("message timeout must be positive; have %v", o.MessageTimeout)
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
	if o.MaxConnsPerHost < 1 {
		bad("max connections per host must be at least 1; have %d", o.MaxConnsPerHost)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid transport options: %w", err)
	}
	return nil
}

// maxMessageBytes is the most frame bytes one message may announce.
func (o Options) maxMessageBytes() int64 {
	if o.MaxFrameBytes > 1<<62 {
		return 1 << 62 // no overflow; no budget is that large anyway
	}
	return o.MaxFrameBytes + messageAllowance
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}
