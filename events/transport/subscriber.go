package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Subscriber receives the messages of many KV event publishers into one
// bounded queue. Publishers either connect to an address it binds (Bind:
// llm-d-inference-sim, vLLM with a tcp://host:port endpoint) or bind
// themselves and are connected to (Connect: vLLM with tcp://*:port).
//
// Every connection has one goroutine that reads it and hands each message
// to the queue without ever waiting: a full queue drops the message,
// counts it and flags the connection's next message with Resync. A
// connecting endpoint's goroutine re-dials after every error, of whatever
// kind, with exponential backoff and jitter. It is built for a few hundred
// publishers and a few hundred thousand ~1 KiB messages a second on one
// core.
type Subscriber struct {
	opts    Options
	log     *slog.Logger
	metrics *Metrics
	topic   []byte
	queue   chan Message

	ctx    context.Context // done when the Subscriber closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the Subscriber started

	mu         sync.Mutex // protects closed, connectors, listeners
	closed     bool
	connectors map[string]*connector // by endpoint
	listeners  []net.Listener

	closeOnce sync.Once
}

// connector owns the goroutine of one connecting endpoint.
type connector struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned
}

// NewSubscriber validates opts and returns a Subscriber with no endpoints.
// metrics may be nil: the counters then go nowhere.
func NewSubscriber(opts Options, metrics *Metrics) (*Subscriber, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		opts:       opts,
		log:        opts.logger(),
		metrics:    metrics,
		topic:      []byte(opts.Topic),
		queue:      make(chan Message, opts.QueueSize),
		ctx:        ctx,
		cancel:     cancel,
		connectors: make(map[string]*connector),
	}, nil
}

// Messages returns the queue. It is closed once Close has stopped every
// goroutine, so a range over it ends after Close.
func (s *Subscriber) Messages() <-chan Message { return s.queue }

// Bind listens on endpoint (tcp://host:port, host * for every interface,
// port 0 for any; or ipc://path) for publishers that connect. It returns the
// endpoint actually bound, which is also the Source of their messages.
func (s *Subscriber) Bind(endpoint string) (string, error) {
	network, addr, err := splitEndpoint(endpoint, true)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrClosed
	}
	var lc net.ListenConfig
	l, err := lc.Listen(s.ctx, network, addr)
	if err != nil {
		return "", fmt.Errorf("bind %s: %w", endpoint, err)
	}
	src := endpointOf(l.Addr())
	s.listeners = append(s.listeners, l)
	s.wg.Add(1)
	go s.accept(l, src)
	s.log.Info("zmq sub bound", "endpoint", src)
	return src, nil
}

// Connect starts receiving from a publisher that binds endpoint
// (tcp://host:port or ipc://path). It returns at once; the connection is
// made, and remade after any failure, in the background. Connecting to an
// endpoint already connected does nothing.
func (s *Subscriber) Connect(endpoint string) error {
	network, addr, err := splitEndpoint(endpoint, false)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, ok := s.connectors[endpoint]; ok {
		return nil
	}
	ctx, cancel := context.WithCancel(s.ctx)
	c := &connector{cancel: cancel, done: make(chan struct{})}
	s.connectors[endpoint] = c
	s.wg.Add(1)
	go s.connect(ctx, c, endpoint, network, addr)
	return nil
}

// Disconnect stops receiving from a connected endpoint and waits until its
// goroutine has returned. It reports whether the endpoint was connected.
func (s *Subscriber) Disconnect(endpoint string) bool {
	s.mu.Lock()
	c, ok := s.connectors[endpoint]
	delete(s.connectors, endpoint)
	s.mu.Unlock()
	if !ok {
		return false
	}
	c.cancel()
	<-c.done
	return true
}

// Endpoints returns the connected endpoints, sorted.
func (s *Subscriber) Endpoints() []string {
	s.mu.Lock()
	eps := make([]string, 0, len(s.connectors))
	for ep := range s.connectors {
		eps = append(eps, ep)
	}
	s.mu.Unlock()
	slices.Sort(eps)
	return eps
}

// Run blocks until ctx is done or Close is called, then closes the
// Subscriber and waits for its goroutines.
func (s *Subscriber) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
	return s.Close()
}

// Close stops every listener and connection, waits for their goroutines
// and closes the queue. It may be called more than once, from any
// goroutine; every call returns after the goroutines have ended.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		ls := s.listeners
		s.listeners = nil
		s.mu.Unlock()
		s.cancel()
		for _, l := range ls {
			_ = l.Close()
		}
		s.wg.Wait()
		close(s.queue)
	})
	return nil
}

// Replay asks a publisher's replay endpoint for its buffered batches from
// start on, with this Subscriber's limits, counting the request and any
// oversize frame under the replay endpoint. See the package function
// Replay.
func (s *Subscriber) Replay(ctx context.Context, endpoint string, start uint64, fn ReplayFunc) error {
	err := replay(ctx, s.opts, s.metrics, endpoint, start, fn)
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.metrics.replays.WithLabelValues(endpoint, result).Inc()
	return err
}

// accept serves one bound address: each publisher that connects gets its
// own goroutine.
func (s *Subscriber) accept(l net.Listener, src string) {
	defer s.wg.Done()
	var peers atomic.Int64
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: count, wait, go on.
			s.metrics.connError(ConnAccept, src)
			s.log.Warn("zmq sub accept failed", "endpoint", src, "err", err)
			if !sleep(s.ctx, s.opts.MinBackoff) {
				return
			}
			continue
		}
		if peers.Load() >= int64(s.opts.MaxPeers) {
			s.metrics.connError(ConnTooMany, src)
			s.log.Warn("zmq sub refused a publisher: too many connected", "endpoint", src, "peer", nc.RemoteAddr().String(), "max_peers", s.opts.MaxPeers)
			_ = nc.Close()
			continue
		}
		peers.Add(1)
		s.wg.Add(1) // the accept goroutine is counted, so Wait has not returned
		go func() {
			defer s.wg.Done()
			defer peers.Add(-1)
			s.serve(s.ctx, nc, newConnState(s.metrics, src), true)
		}()
	}
}

// connect keeps one connecting endpoint connected until ctx is done.
func (s *Subscriber) connect(ctx context.Context, c *connector, endpoint, network, addr string) {
	defer s.wg.Done()
	defer close(c.done)
	bo := backoff{min: s.opts.MinBackoff, max: s.opts.MaxBackoff}
	st := newConnState(s.metrics, endpoint) // Resync outlives reconnects
	d := net.Dialer{Timeout: s.opts.DialTimeout}
	failures := 0
	for {
		nc, err := d.DialContext(ctx, network, addr)
		if ctx.Err() != nil {
			if err == nil {
				_ = nc.Close()
			}
			return
		}
		if err != nil {
			s.metrics.connError(ConnDial, endpoint)
			failures++
			if failures == 1 {
				s.log.Info("zmq publisher unreachable; retrying", "endpoint", endpoint, "err", err)
			} else {
				s.log.Debug("zmq publisher still unreachable", "endpoint", endpoint, "attempts", failures, "err", err)
			}
		} else if s.serve(ctx, nc, st, false) {
			bo.reset()
			failures = 0
		}
		if !sleep(ctx, bo.next()) {
			return
		}
	}
}

// connState is what one connection's goroutine keeps about its source.
type connState struct {
	src    string
	m      sourceMetrics
	resync bool // a message was dropped since the last one queued
}

func newConnState(m *Metrics, src string) *connState {
	return &connState{src: src, m: m.source(src)}
}

// serve runs one ZMTP connection as a SUB: handshake, subscription, then
// messages into the queue until an error or ctx ends it. It closes nc and
// reports whether the connection was healthy: it delivered a message, or
// stayed up for MaxBackoff. A peer that completes the handshake and hangs
// up at once is not, so re-dialling it backs off.
func (s *Subscriber) serve(ctx context.Context, nc net.Conn, st *connState, server bool) (healthy bool) {
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer func() {
		stop()
		_ = nc.Close()
	}()
	peer := nc.RemoteAddr().String()
	g := newGuardConn(nc, s.opts.ReadBufferSize, s.opts.MaxFrameBytes, s.opts.MaxFrames)

	_ = nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	zc, err := openZMTP(g, zmq4.Sub, server)
	if err != nil {
		s.connFailed(ctx, st.src, peer, ConnHandshake, err)
		return false
	}
	if err := subscribe(zc, s.opts.Topic); err != nil {
		s.connFailed(ctx, st.src, peer, ConnSubscribe, err)
		return false
	}
	_ = nc.SetDeadline(time.Time{})

	conns := s.metrics.conns.WithLabelValues(st.src)
	conns.Inc()
	defer conns.Dec()
	s.log.Info("zmq publisher connected", "source", st.src, "peer", peer)
	up := time.Now()
	delivered := false

	for {
		msg, err := recvMsg(zc)
		if err != nil {
			s.connFailed(ctx, st.src, peer, ConnClosed, err)
			return delivered || time.Since(up) >= s.opts.MaxBackoff
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) == 0 {
			continue // PING is answered inside RecvMsg; nothing else concerns a SUB
		}
		if !bytes.HasPrefix(msg.Frames[0], s.topic) {
			st.m.topic.Inc()
			continue
		}
		delivered = true
		m := Message{Source: st.src, Peer: peer, RecvTime: time.Now(), Frames: msg.Frames, Resync: st.resync}
		select {
		case s.queue <- m:
			st.resync = false
			st.m.messages.Inc()
			st.m.bytes.Add(float64(m.size()))
		default:
			st.resync = true
			st.m.queueFull.Inc()
		}
	}
}

// connFailed counts and logs the end of a connection, unless the
// Subscriber itself ended it. reason is used unless the error says
// oversize or protocol.
func (s *Subscriber) connFailed(ctx context.Context, src, peer, reason string, err error) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case errors.Is(err, ErrFrameTooLarge):
		reason = ConnOversize
		s.metrics.oversize.WithLabelValues(src).Inc()
	case errors.Is(err, ErrProtocol) && reason == ConnClosed:
		reason = ConnProtocol
	}
	s.metrics.connError(reason, src)
	s.log.Warn("zmq publisher connection ended", "source", src, "peer", peer, "reason", reason, "err", err)
}

// backoff is exponential backoff with equal jitter: each wait is half the
// current step plus a random part of the other half.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur < b.min {
		b.cur = b.min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits for d or until ctx is done, and reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
