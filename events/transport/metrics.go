package transport

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/promreg"
)

// Drop reasons of prefixd_ingest_dropped_total written by this package.
const (
	// DropQueueFull: the consumer's queue was full.
	DropQueueFull = "queue_full"
	// DropTopic: the message's first frame does not start with the topic
	// prefix (a publisher that ignores subscriptions).
	DropTopic = "topic_filter"
	// DropMemory: a frame of the message did not fit in the memory budget
	// (Options.MaxBufferedBytes); the message was read past, never stored.
	DropMemory = "memory"
)

// Connection error reasons of prefixd_ingest_connection_errors_total.
const (
	ConnDial            = "dial"               // the TCP connect failed
	ConnHandshake       = "handshake"          // the ZMTP greeting or READY failed or took over HandshakeTimeout
	ConnOversize        = "oversize"           // a frame over MaxFrameBytes, or a message over MaxFrameBytes + 64 KiB
	ConnProtocol        = "protocol"           // ZMTP framing broken after the handshake
	ConnSlowMessage     = "slow_message"       // a message unfinished MessageTimeout after it began
	ConnMemory          = "memory"             // a command frame that did not fit in the memory budget
	ConnClosed          = "closed"             // EOF, reset, or any other read error
	ConnPanic           = "panic"              // a panic in the connection's goroutine, recovered (a bug)
	ConnAccept          = "accept"             // Accept failed on a bound address
	ConnTooMany         = "too_many"           // a bound address already had MaxPeers
	ConnTooManyFromHost = "too_many_from_host" // a bound address already had MaxConnsPerHost from the peer's IP
	ConnSubscribe       = "subscribe"          // sending the subscription failed
	ConnReplyShape      = "reply_shape"        // a replay reply of the wrong shape
)

// Metrics are the transport's Prometheus metrics. Every family is labelled
// by source: the endpoint connected to, or the address bound.
//
// A connection is counted in prefixd_ingest_handshakes from the moment it
// is accepted or dialled until its ZMTP handshake and subscription are
// done or fail, then in prefixd_ingest_connections until it ends: the two
// gauges together are the connections open.
//
// prefixd_ingest_dropped_total{reason,source} is shared with the layers
// above (decode errors, gaps): they register the same name with the same
// labels and NewMetrics reuses whichever collector came first.
type Metrics struct {
	messages   *prometheus.CounterVec // source
	bytes      *prometheus.CounterVec // source
	dropped    *prometheus.CounterVec // reason, source
	oversize   *prometheus.CounterVec // source
	connErrors *prometheus.CounterVec // reason, source
	conns      *prometheus.GaugeVec   // source
	handshakes *prometheus.GaugeVec   // source
	replays    *prometheus.CounterVec // source, result
}

// NewMetrics builds the metrics and registers them with reg, which may be
// nil (tests). A family already registered under the same name and labels
// is reused.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_messages_total",
			Help: "ZeroMQ messages received and queued for decoding, by source.",
		}, []string{"source"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_bytes_total",
			Help: "Frame bytes of the messages received and queued, by source.",
		}, []string{"source"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_dropped_total",
			Help: "Messages dropped on ingest, by reason and source.",
		}, []string{"reason", "source"}),
		oversize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_oversize_frames_total",
			Help: "Frames refused because their header announced more than the frame size limit, or took their message over the message size limit; each closes its connection.",
		}, []string{"source"}),
		connErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_connection_errors_total",
			Help: "Publisher connections that failed or ended, by reason and source.",
		}, []string{"reason", "source"}),
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixd_ingest_connections",
			Help: "Publisher connections open now and past their handshake, by source.",
		}, []string{"source"}),
		handshakes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixd_ingest_handshakes",
			Help: "Connections open now and still in their ZMTP handshake, by source.",
		}, []string{"source"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_replay_requests_total",
			Help: "Replay requests sent to publishers' replay endpoints, by source and result (ok, error).",
		}, []string{"source", "result"}),
	}
	if reg == nil {
		return m
	}
	m.messages = promreg.Register(reg, m.messages)
	m.bytes = promreg.Register(reg, m.bytes)
	m.dropped = promreg.Register(reg, m.dropped)
	m.oversize = promreg.Register(reg, m.oversize)
	m.connErrors = promreg.Register(reg, m.connErrors)
	m.conns = promreg.Register(reg, m.conns)
	m.handshakes = promreg.Register(reg, m.handshakes)
	m.replays = promreg.Register(reg, m.replays)
	return m
}

// sourceMetrics are the children of one source, resolved once per
// connection so the receive loop does no label lookups.
type sourceMetrics struct {
	messages   prometheus.Counter
	bytes      prometheus.Counter
	queueFull  prometheus.Counter
	topic      prometheus.Counter
	memory     prometheus.Counter
	conns      prometheus.Gauge
	handshakes prometheus.Gauge
}

func (m *Metrics) source(src string) sourceMetrics {
	return sourceMetrics{
		messages:   m.messages.WithLabelValues(src),
		bytes:      m.bytes.WithLabelValues(src),
		queueFull:  m.dropped.WithLabelValues(DropQueueFull, src),
		topic:      m.dropped.WithLabelValues(DropTopic, src),
		memory:     m.dropped.WithLabelValues(DropMemory, src),
		conns:      m.conns.WithLabelValues(src),
		handshakes: m.handshakes.WithLabelValues(src),
	}
}

func (m *Metrics) connError(reason, src string) {
	m.connErrors.WithLabelValues(reason, src).Inc()
}
