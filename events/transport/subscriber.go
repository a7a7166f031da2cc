package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixd/prefixd/internal/ratelog"
)

// Subscriber receives the messages of many KV event publishers into one
// bounded queue. Publishers either connect to an address it binds (Bind:
// llm-d-inference-sim, vLLM with a tcp://host:port endpoint) or bind
// themselves and are connected to (Connect: vLLM with tcp://*:port).
//
// Every connection has one goroutine that reads it and hands each message
// to the queue without ever waiting: a full queue, or a memory budget that
// cannot hold the message (see Options.MaxBufferedBytes), drops it, counts
// it and flags the connection's next message with Resync. A
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
	mem     *budget // frames being received or queued and not released

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
		mem:        &budget{limit: opts.MaxBufferedBytes},
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
	err := replay(ctx, s.opts, s.metrics, s.mem, endpoint, start, fn)
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.metrics.replays.WithLabelValues(endpoint, result).Inc()
	return err
}

// accept serves one bound address: each publisher that connects gets its
// own goroutine, within MaxPeers and MaxConnsPerHost.
func (s *Subscriber) accept(l net.Listener, src string) {
	defer s.wg.Done()
	b := &boundAddr{maxPeers: s.opts.MaxPeers, maxPerHost: s.opts.MaxConnsPerHost, hosts: make(map[netip.Addr]int)}
	refusals := map[string]*ratelog.Limiter{
		ConnTooMany:         ratelog.New(refusalLogInterval),
		ConnTooManyFromHost: ratelog.New(refusalLogInterval),
	}
	m := s.metrics.source(src)
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
		host, hasHost := hostOf(nc.RemoteAddr())
		if reason := b.admit(host, hasHost); reason != "" {
			s.metrics.connError(reason, src)
			if ok, suppressed := refusals[reason].Allow(); ok {
				s.log.Warn("zmq sub refused a publisher", "endpoint", src, "peer", nc.RemoteAddr().String(), "reason", reason,
					"max_peers", s.opts.MaxPeers, "max_conns_per_host", s.opts.MaxConnsPerHost, "refused_unlogged", suppressed)
			}
			_ = nc.Close()
			continue
		}
		s.wg.Add(1) // the accept goroutine is counted, so Wait has not returned
		go func() {
			defer s.wg.Done()
			defer b.leave(host, hasHost)
			s.serve(s.ctx, nc, &connState{src: src, m: m, inbound: true})
		}()
	}
}

// refusalLogInterval is the least time between two log lines about
// connections a bound address refused for one reason: a flood of them is
// counted in full but logged a line at a time.
const refusalLogInterval = 10 * time.Second

// boundAddr counts the connections of one bound address.
type boundAddr struct {
	maxPeers, maxPerHost int

	mu    sync.Mutex // protects peers, hosts
	peers int
	hosts map[netip.Addr]int // connections by source IP; absent when 0
}

// admit takes a place for a connection from host, which hasHost says
// whether the connection has (unix socket peers do not), or returns the
// reason it gets none.
func (b *boundAddr) admit(host netip.Addr, hasHost bool) (refused string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if hasHost && b.hosts[host] >= b.maxPerHost {
		return ConnTooManyFromHost
	}
	if b.peers >= b.maxPeers {
		return ConnTooMany
	}
	b.peers++
	if hasHost {
		b.hosts[host]++
	}
	return ""
}

// leave gives back a place admit took.
func (b *boundAddr) leave(host netip.Addr, hasHost bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peers--
	if !hasHost {
		return
	}
	if n := b.hosts[host] - 1; n > 0 {
		b.hosts[host] = n
	} else {
		delete(b.hosts, host)
	}
}

// hostOf returns the IP address of a TCP peer (IPv4-mapped IPv6 addresses
// as IPv4), and false for other peers.
func hostOf(a net.Addr) (netip.Addr, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	return ip.Unmap(), ok
}

// connect keeps one connecting endpoint connected until ctx is done.
func (s *Subscriber) connect(ctx context.Context, c *connector, endpoint, network, addr string) {
	defer s.wg.Done()
	defer close(c.done)
	bo := backoff{min: s.opts.MinBackoff, max: s.opts.MaxBackoff}
	st := &connState{src: endpoint, m: s.metrics.source(endpoint)} // Resync outlives reconnects
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
		} else if s.serve(ctx, nc, st) {
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
	src     string
	m       sourceMetrics
	inbound bool // accepted on a bound address, not dialled
	resync  bool // a message was dropped since the last one queued
	leases  leases
}

// serve runs one ZMTP connection as a SUB: handshake, subscription, then
// messages into the queue until an error or ctx ends it. It closes nc and
// reports whether the connection was healthy: it delivered a message, or
// stayed up for MaxBackoff. A peer that completes the handshake and hangs
// up at once is not, so re-dialling it backs off. A panic in it ends the
// connection alone, counted and logged by Options.Recovery.
func (s *Subscriber) serve(ctx context.Context, nc net.Conn, st *connState) (healthy bool) {
	peer := nc.RemoteAddr().String()
	defer func() {
		if r := recover(); r != nil {
			err := s.opts.Recovery.Error(r, "zmq_connection")
			s.connFailed(ctx, st.src, peer, ConnPanic, err)
			healthy = false
		}
	}()
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	g := newGuardConn(nc, s.opts, s.mem)
	defer func() {
		stop()
		_ = nc.Close()
		g.release() // a message cut short
	}()

	zc, reason, err := s.handshake(nc, g, st)
	if err != nil {
		s.connFailed(ctx, st.src, peer, reason, err)
		return false
	}
	g.arm(s.opts.MessageTimeout)

	st.m.conns.Inc()
	defer st.m.conns.Dec()
	s.log.Info("zmq publisher connected", "source", st.src, "peer", peer)
	up := time.Now()
	delivered := false
	defer func() {
		if delivered {
			s.notifyClosed(ctx, st, peer)
		}
	}()

	for {
		msg, err := recvMsg(zc)
		if err != nil {
			if g.dropped { // cut short while being dropped for lack of memory
				st.resync = true
				st.m.memory.Inc()
			}
			s.connFailed(ctx, st.src, peer, ConnClosed, err)
			return delivered || time.Since(up) >= s.opts.MaxBackoff
		}
		reserved, dropped := g.take()
		if dropped {
			st.resync = true
			st.m.memory.Inc()
			continue
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) == 0 {
			s.mem.release(reserved)
			continue // PING is answered inside RecvMsg; nothing else concerns a SUB
		}
		if !bytes.HasPrefix(msg.Frames[0], s.topic) {
			s.mem.release(reserved)
			st.m.topic.Inc()
			continue
		}
		delivered = true
		m := Message{Source: st.src, Peer: peer, RecvTime: time.Now(), Frames: msg.Frames, Resync: st.resync, Inbound: st.inbound}
		if reserved > 0 {
			m.lease = st.leases.take(s.mem, reserved)
		}
		select {
		case s.queue <- m:
			st.resync = false
			st.m.messages.Inc()
			st.m.bytes.Add(float64(reserved))
		default:
			s.mem.release(reserved)
			st.resync = true
			st.m.queueFull.Inc()
		}
	}
}

// notifyClosed queues the notice that a connection which delivered messages has
// ended, waiting for room: a notice dropped would hide a possible gap. It
// gives up only when the Subscriber closes.
func (s *Subscriber) notifyClosed(ctx context.Context, st *connState, peer string) {
	m := Message{Source: st.src, Peer: peer, RecvTime: time.Now(), Closed: true, Inbound: st.inbound}
	select {
	case s.queue <- m:
	case <-ctx.Done():
	}
}

// handshake runs the ZMTP handshake and sends the subscription, within
// HandshakeTimeout of the connection's start, counting the connection in
// prefixd_ingest_handshakes meanwhile. On failure it returns the reason
// to count.
func (s *Subscriber) handshake(nc net.Conn, g *guardConn, st *connState) (*zmq4.Conn, string, error) {
	st.m.handshakes.Inc()
	defer st.m.handshakes.Dec()
	_ = nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	zc, err := openZMTP(g, zmq4.Sub, st.inbound)
	reserved, _ := g.take() // the READY command
	s.mem.release(reserved)
	if err != nil {
		return nil, ConnHandshake, err
	}
	if err := subscribe(zc, s.opts.Topic); err != nil {
		return nil, ConnSubscribe, err
	}
	_ = nc.SetDeadline(time.Time{})
	return zc, "", nil
}

// connFailed counts and logs the end of a connection, unless the
// Subscriber itself ended it. reason is used unless the error says
// what went wrong more precisely.
func (s *Subscriber) connFailed(ctx context.Context, src, peer, reason string, err error) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrMessageTooLarge):
		reason = ConnOversize
		s.metrics.oversize.WithLabelValues(src).Inc()
	case errors.Is(err, ErrSlowMessage):
		reason = ConnSlowMessage
	case errors.Is(err, ErrMemory):
		reason = ConnMemory
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
