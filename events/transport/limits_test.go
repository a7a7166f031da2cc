package transport

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/recovery"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// waitClosed fails unless the peer of c closes it within waitLimit.
func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) || (err != nil && !isReset(err)) {
		t.Fatalf("want the subscriber to close the connection; read: %v", err)
	}
}

// heapBytes is the Go heap's size in objects, live and not yet swept.
func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// 20 connections each announce a message of 7 frames of 16 MiB and send
// it as fast as they can. The message cap refuses each at its second
// frame and the budget bounds what their first frames hold together, so
// the process's heap stays within the budget and some slack; then a real
// publisher on the same address gets its messages through.
func TestHostileMultipartFloodStaysWithinBudget(t *testing.T) {
	const (
		conns  = 20
		frames = 7
		frame  = 16 << 20
		limit  = 64 << 20
		slack  = 96 << 20 // the writers' 16 MiB, read buffers, garbage awaiting the GC
	)
	// Garbage is part of what is measured: collect it sooner than usual.
	gc := debug.SetGCPercent(25)
	t.Cleanup(func() { debug.SetGCPercent(gc) })
	s, reg := newSub(t, func(o *Options) { o.MaxBufferedBytes = limit })
	ep := bind(t, s)
	body := make([]byte, frame)
	debug.FreeOSMemory()
	base := heapBytes()

	var peak atomic.Uint64
	sampled := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), heapBytes()))
			select {
			case <-stop:
				return
			case <-t.Context().Done(): // failed before stop
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	start := make(chan struct{}) // all at once, as a flood is
	for range conns {
		c := zmqpub.Dial(t, ep)
		if err := zmqpub.Handshake(c, "PUB"); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			select {
			case <-start:
			case <-t.Context().Done(): // failed before the start
				return
			}
			for range frames {
				if _, err := c.Write(zmqpub.FrameHeader(frame, 1)); err != nil {
					return
				}
				if _, err := c.Write(body); err != nil {
					return
				}
			}
		})
	}
	close(start)
	oversize := map[string]string{"reason": ConnOversize, "source": ep}
	waitFor(t, "every hostile message refused", func() bool {
		return counter(t, reg, "prefixd_ingest_connection_errors_total", oversize) == conns
	})
	wg.Wait()
	close(stop)
	<-sampled
	waitFor(t, "the budget emptied", func() bool { return s.mem.used.Load() == 0 })
	grew := int64(peak.Load()) - int64(base)
	t.Logf("heap grew by %d MiB at most (budget %d MiB); %v messages dropped for memory on the way", grew>>20, limit>>20,
		counter(t, reg, "prefixd_ingest_dropped_total", map[string]string{"reason": DropMemory, "source": ep}))
	if grew > limit+slack {
		t.Fatalf("heap grew by %d MiB; want at most the %d MiB budget and %d MiB", grew>>20, limit>>20, slack>>20)
	}
	if v := counter(t, reg, "prefixd_ingest_messages_total", map[string]string{"source": ep}); v != 0 {
		t.Fatalf("%v hostile messages queued", v)
	}

	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	p.Send(msg(1)...)
	if m := recv(t, s, 1)[0]; !sameFrames(m.Frames, msg(1)) {
		t.Fatalf("after the flood: got %q", m.Frames)
	}
}

// bigMsg is msg(seq) with a payload of n bytes.
func bigMsg(seq uint64, n int) [][]byte {
	m := msg(seq)
	m[2] = make([]byte, n)
	copy(m[2], m[1])
	return m
}

// A receiver that keeps its messages without releasing them fills the
// budget: later messages are dropped (reason memory), never queued. Once it
// releases, messages flow again, the first flagged Resync.
func TestBudgetDropsUntilReleased(t *testing.T) {
	const (
		payload = 4000
		sent    = 30
		limit   = payload + messageAllowance
	)
	size := 0
	for _, f := range bigMsg(1, payload) {
		size += len(f)
	}
	fit := limit / size
	s, reg := newSub(t, func(o *Options) {
		o.MaxFrameBytes = payload
		o.MaxBufferedBytes = limit
	})
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	for i := uint64(1); i <= sent; i++ {
		p.Send(bigMsg(i, payload)...)
	}
	src := map[string]string{"source": ep}
	dropped := map[string]string{"reason": DropMemory, "source": ep}
	waitFor(t, "every message queued or dropped", func() bool {
		return counter(t, reg, "prefixd_ingest_messages_total", src)+counter(t, reg, "prefixd_ingest_dropped_total", dropped) == sent
	})
	if v := counter(t, reg, "prefixd_ingest_messages_total", src); v != float64(fit) {
		t.Fatalf("%v messages queued; want the %d that fit in %d bytes", v, fit, limit)
	}
	held := make([]Message, 0, fit)
	for range fit {
		held = append(held, <-s.Messages())
	}
	for i, m := range held {
		if m.Resync || !sameFrames(m.Frames, bigMsg(uint64(i+1), payload)) {
			t.Fatalf("held message %d: Resync %v, seq frame %x", i, m.Resync, m.Frames[1])
		}
	}
	if used := s.mem.used.Load(); used != int64(fit*size) {
		t.Fatalf("budget holds %d bytes; want the %d of the held messages", used, fit*size)
	}
	for _, m := range held {
		m.Release()
		m.Release() // a second Release does nothing
	}
	if used := s.mem.used.Load(); used != 0 {
		t.Fatalf("budget holds %d bytes after every message was released", used)
	}

	p.Send(bigMsg(sent+1, payload)...)
	p.Send(bigMsg(sent+2, payload)...)
	got := recv(t, s, 2)
	if !got[0].Resync || !sameFrames(got[0].Frames, bigMsg(sent+1, payload)) || got[1].Resync {
		t.Fatalf("after the release: Resync %v, %v, seq frame %x; want seq %d with Resync, then one without", got[0].Resync, got[1].Resync, got[0].Frames[1], sent+1)
	}
}

// A connection that starts a message and does not finish it is closed
// after MessageTimeout, wherever it stalls, and what it reserved is given
// back. A connection idle between messages is not timed.
func TestStalledMessageClosedAfterMessageTimeout(t *testing.T) {
	s, reg := newSub(t, func(o *Options) { o.MessageTimeout = 200 * time.Millisecond })
	ep := bind(t, s)
	idle := zmqpub.Dial(t, ep)
	if err := zmqpub.Handshake(idle, "PUB"); err != nil {
		t.Fatal(err)
	}
	slow := map[string]string{"reason": ConnSlowMessage, "source": ep}
	for i, stall := range [][]byte{
		{0x01},                      // half a frame header
		zmqpub.FrameHeader(1000, 0), // a header, no body
		append(zmqpub.FrameHeader(1<<20, 0), "ten bytes."...),     // part of a body
		zmqpub.Frame([]byte("kv@127.0.0.1:8001@sim-model"), true), // a frame with MORE, then nothing
	} {
		c := zmqpub.Dial(t, ep)
		if err := zmqpub.Handshake(c, "PUB"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(stall); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c)
		waitFor(t, fmt.Sprintf("stall %d counted", i), func() bool {
			return counter(t, reg, "prefixd_ingest_connection_errors_total", slow) == float64(i+1)
		})
		waitFor(t, "the reservation given back", func() bool { return s.mem.used.Load() == 0 })
	}
	// The idle connection has waited longer than MessageTimeout, and still
	// delivers.
	if _, err := idle.Write(zmqpub.Message(msg(1)...)); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, s, 1)[0]; !sameFrames(m.Frames, msg(1)) {
		t.Fatalf("from the idle connection: %q", m.Frames)
	}
}

// A peer that never sends a byte is counted in prefixd_ingest_handshakes
// while it is open and closed after HandshakeTimeout; 500 of them too.
func TestHandshakeTimeoutClosesSilentPeers(t *testing.T) {
	t.Run("visible while open", func(t *testing.T) {
		s, reg := newSub(t, func(o *Options) { o.HandshakeTimeout = 2 * waitLimit })
		ep := bind(t, s)
		src := map[string]string{"source": ep}
		c := zmqpub.Dial(t, ep)
		waitFor(t, "the silent peer counted in its handshake", func() bool {
			return counter(t, reg, "prefixd_ingest_handshakes", src) == 1
		})
		if v := counter(t, reg, "prefixd_ingest_connections", src); v != 0 {
			t.Fatalf("prefixd_ingest_connections = %v during the handshake; want 0", v)
		}
		_ = c.Close()
		waitFor(t, "the silent peer gone", func() bool {
			return counter(t, reg, "prefixd_ingest_handshakes", src) == 0 &&
				counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnHandshake, "source": ep}) == 1
		})
	})
	t.Run("500 closed", func(t *testing.T) {
		const peers, hosts = 500, 5 // within the default 128 a host
		s, reg := newSub(t, func(o *Options) { o.HandshakeTimeout = 300 * time.Millisecond })
		ep := bind(t, s)
		conns := make([]net.Conn, peers)
		for i := range conns {
			conns[i] = zmqpub.DialFrom(t, ep, fmt.Sprintf("127.0.0.%d", 1+i%hosts))
		}
		for _, c := range conns {
			waitClosed(t, c)
		}
		src := map[string]string{"source": ep}
		waitFor(t, "every silent peer counted", func() bool {
			return counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnHandshake, "source": ep}) == peers &&
				counter(t, reg, "prefixd_ingest_handshakes", src) == 0
		})
	})
}

// countingHandler counts the log records with one message.
type countingHandler struct {
	msg string
	n   atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countingHandler) WithGroup(string) slog.Handler            { return h }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}

// A source address gets at most MaxConnsPerHost connections to a bound
// address; more are refused, counted, and logged a line at a time. Another
// source address still connects, and a place freed is taken again.
func TestMaxConnsPerHost(t *testing.T) {
	const perHost, flood = 3, 200
	logs := &countingHandler{msg: "zmq sub refused a publisher"}
	s, reg := newSub(t, func(o *Options) {
		o.MaxConnsPerHost = perHost
		o.HandshakeTimeout = 2 * waitLimit
		o.Logger = slog.New(logs)
	})
	ep := bind(t, s)
	src := map[string]string{"source": ep}
	handshakes := func(n int) func() bool {
		return func() bool { return counter(t, reg, "prefixd_ingest_handshakes", src) == float64(n) }
	}
	held := make([]net.Conn, perHost)
	for i := range held {
		held[i] = zmqpub.DialFrom(t, ep, "127.0.0.1")
	}
	waitFor(t, "the first connections accepted", handshakes(perHost))

	start := time.Now()
	for range flood {
		waitClosed(t, zmqpub.DialFrom(t, ep, "127.0.0.1"))
	}
	elapsed := time.Since(start)
	if v := counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnTooManyFromHost, "source": ep}); v != flood {
		t.Fatalf("connection_errors{too_many_from_host} = %v; want %d", v, flood)
	}
	if lines, most := logs.n.Load(), 1+int64(elapsed/refusalLogInterval)+1; lines < 1 || lines > most {
		t.Fatalf("%d log lines for %d refusals in %v; want 1 to %d", lines, flood, elapsed, most)
	}

	other := zmqpub.DialFrom(t, ep, "127.0.0.2")
	waitFor(t, "a connection from another host accepted", handshakes(perHost+1))
	_ = held[0].Close()
	waitFor(t, "a place freed", handshakes(perHost))
	zmqpub.DialFrom(t, ep, "127.0.0.1")
	waitFor(t, "the freed place taken", handshakes(perHost+1))
	_ = other.Close()
}

// Messages say whether their publisher connected to a bound address.
func TestInbound(t *testing.T) {
	s, _ := newSub(t, nil)
	bound := bind(t, s)
	in := zmqpub.Start(t)
	in.Connect(bound)
	out := zmqpub.Start(t)
	dialled := out.Bind("tcp://127.0.0.1:0")
	if err := s.Connect(dialled); err != nil {
		t.Fatal(err)
	}
	in.WaitSubscribed()
	out.WaitSubscribed()
	in.Send(msg(1)...)
	out.Send(msg(2)...)
	for _, m := range recv(t, s, 2) {
		if want := m.Source == bound; m.Inbound != want {
			t.Fatalf("message from %s: Inbound %v; want %v", m.Source, m.Inbound, want)
		}
	}
}

// panicOnceHandler panics the first time it handles a record with msg.
type panicOnceHandler struct {
	msg  string
	done atomic.Bool
}

func (h *panicOnceHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *panicOnceHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *panicOnceHandler) WithGroup(string) slog.Handler            { return h }
func (h *panicOnceHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg && !h.done.Swap(true) {
		panic("a bug reached from a connection")
	}
	return nil
}

// A panic in a connection's goroutine ends that connection alone, counted
// and logged; the publisher reconnects and delivers.
func TestPanicInConnectionIsRecovered(t *testing.T) {
	recovery.KeepRecovered(t)
	reg := prometheus.NewRegistry()
	rec := recovery.New(reg, slog.New(slog.DiscardHandler))
	s, sreg := newSub(t, func(o *Options) {
		o.Logger = slog.New(&panicOnceHandler{msg: "zmq publisher connected"})
		o.Recovery = rec
	})
	ep := bind(t, s)
	other := zmqpub.Start(t)
	otherEp := other.Bind("tcp://127.0.0.1:0")
	if err := s.Connect(otherEp); err != nil { // connects first: its connection panics
		t.Fatal(err)
	}
	waitFor(t, "the panic counted", func() bool {
		return counter(t, reg, "prefixd_panics_total", map[string]string{"where": "zmq_connection"}) == 1 &&
			counter(t, sreg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnPanic, "source": otherEp}) == 1
	})
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	p.Send(msg(1)...)
	if m := recv(t, s, 1)[0]; m.Source != ep {
		t.Fatalf("message from %s; want %s", m.Source, ep)
	}
	if m := sendUntilReceived(t, other, s, msg(2)); m.Source != otherEp { // re-dialled
		t.Fatalf("message from %s; want %s", m.Source, otherEp)
	}
}

// A panic during a replay ends it with an error, counted; what the reply
// held in the budget is given back.
func TestReplayRecoversPanic(t *testing.T) {
	recovery.KeepRecovered(t)
	reg := prometheus.NewRegistry()
	s, _ := newSub(t, func(o *Options) { o.Recovery = recovery.New(reg, slog.New(slog.DiscardHandler)) })
	p := zmqpub.Start(t)
	p.Bind("tcp://127.0.0.1:0")
	p.Send(msg(1)...)
	ep := p.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	err := s.Replay(t.Context(), ep, 0, func(uint64, []byte, []byte) error { panic("a bug reached from a replay") })
	if !errors.Is(err, recovery.ErrPanic) {
		t.Fatalf("err %v; want a recovered panic", err)
	}
	if v := counter(t, reg, "prefixd_panics_total", map[string]string{"where": "zmq_replay"}); v != 1 {
		t.Fatalf("prefixd_panics_total{zmq_replay} = %v; want 1", v)
	}
	if used := s.mem.used.Load(); used != 0 {
		t.Fatalf("budget holds %d bytes after the replay", used)
	}
}

func TestAddFlags(t *testing.T) {
	flags := func(o *Options) *flag.FlagSet {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		return fs
	}
	var o Options
	flags(&o)
	d := DefaultOptions()
	if o.MaxBufferedBytes != d.MaxBufferedBytes || o.MessageTimeout != d.MessageTimeout || o.HandshakeTimeout != d.HandshakeTimeout ||
		o.MaxConnsPerHost != d.MaxConnsPerHost || o.MaxPeers != d.MaxPeers || o.MaxFrameBytes != d.MaxFrameBytes || o.QueueSize != d.QueueSize {
		t.Fatalf("defaults %+v; want those of DefaultOptions", o)
	}
	o = DefaultOptions()
	if err := flags(&o).Parse([]string{
		"--zmq-max-buffered-bytes=1073741824", "--zmq-message-timeout=3s", "--zmq-handshake-timeout=4s",
		"--zmq-max-conns-per-host=5", "--zmq-max-peers=6", "--zmq-max-frame-bytes=1048576", "--zmq-queue-size=7",
	}); err != nil {
		t.Fatal(err)
	}
	want := DefaultOptions()
	want.MaxBufferedBytes, want.MessageTimeout, want.HandshakeTimeout = 1<<30, 3*time.Second, 4*time.Second
	want.MaxConnsPerHost, want.MaxPeers, want.MaxFrameBytes, want.QueueSize = 5, 6, 1<<20, 7
	if o != want {
		t.Fatalf("parsed %+v; want %+v", o, want)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	o = DefaultOptions()
	if err := flags(&o).Parse([]string{"--zmq-max-buffered-bytes=1048576"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err == nil {
		t.Fatal("a budget smaller than the largest message validated")
	}
}
