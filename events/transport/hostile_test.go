package transport

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// hugeFrame is a frame header announcing 2^50 bytes.
var hugeFrame = zmqpub.FrameHeader(1<<50, 0)

// hostilePublisher serves, to every subscriber that connects, a ZMTP
// handshake followed by send, then holds the connection until it closes.
func hostilePublisher(t *testing.T, send []byte) string {
	return zmqpub.Serve(t, func(c net.Conn) {
		if zmqpub.Handshake(c, "PUB") != nil {
			return
		}
		_, _ = c.Write(send)
		_, _ = io.Copy(io.Discard, c)
	})
}

// The guard is what keeps a frame announcing 2^50 bytes from crashing the
// process: zmq4 alone panics in makeslice (a frame announcing 2^40 bytes
// would instead exhaust memory, which no recover can catch).
func TestGuardPreventsZmq4PanicOnHugeFrame(t *testing.T) {
	ep := hostilePublisher(t, hugeFrame)
	recvOne := func(guard bool) (panicked any, err error) {
		nc, err := net.Dial("tcp", ep[len("tcp://"):])
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = nc.Close() }()
		c := nc
		if guard {
			c = newGuardConn(nc, DefaultOptions(), &budget{limit: 1 << 30})
		}
		defer func() { panicked = recover() }()
		zc, err := zmq4.Open(c, null.Security(), zmq4.Sub, nil, false, nil)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		_, err = zc.RecvMsg()
		return nil, err
	}

	p, err := recvOne(false)
	if p == nil {
		t.Fatalf("zmq4 without the guard did not panic (err %v); the guard may no longer be needed", err)
	}
	t.Logf("zmq4 without the guard: panic: %v", p)

	p, err = recvOne(true)
	if p != nil || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("guarded: panic %v, err %v; want ErrFrameTooLarge", p, err)
	}
}

// A frame announcing 2^50 bytes on a bound SUB closes that connection and is
// counted; a real publisher on the same address carries on.
func TestOversizeFrameOnBoundSUB(t *testing.T) {
	s, reg := newSub(t, nil)
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	p.Send(msg(1)...)
	recv(t, s, 1)

	c := zmqpub.Dial(t, ep)
	if err := zmqpub.Handshake(c, "PUB"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(hugeFrame); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("want the subscriber to close the connection; read: %v", err)
	}
	src := map[string]string{"source": ep}
	waitFor(t, "oversize frame counted", func() bool {
		return counter(t, reg, "prefixd_ingest_oversize_frames_total", src) == 1 &&
			counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnOversize, "source": ep}) == 1
	})

	p.Send(msg(2)...)
	if m := recv(t, s, 1)[0]; !sameFrames(m.Frames, msg(2)) {
		t.Fatalf("after the oversize frame: got %q", m.Frames)
	}
}

// A bound publisher that sends a frame announcing 2^50 bytes is refused,
// counted and re-dialled with backoff; another endpoint carries on.
func TestOversizeFrameOnConnectingSUB(t *testing.T) {
	hostile := hostilePublisher(t, hugeFrame)
	s, reg := newSub(t, nil)
	p := zmqpub.Start(t)
	good := p.Bind("tcp://127.0.0.1:0")
	for _, ep := range []string{hostile, good} {
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "two oversize frames from the re-dialled endpoint", func() bool {
		return counter(t, reg, "prefixd_ingest_oversize_frames_total", map[string]string{"source": hostile}) >= 2
	})
	p.WaitSubscribed()
	p.Send(msg(1)...)
	if m := recv(t, s, 1)[0]; m.Source != good {
		t.Fatalf("message from %s; want %s", m.Source, good)
	}
}

// Garbage of every kind is refused and counted under the right reason; none
// of it panics, and a real publisher on the same bound address carries on.
func TestGarbageOnBoundSUB(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	random[0] = 0x42 // not a greeting
	oldGreeting := zmqpub.Greeting()
	oldGreeting[10] = 2
	handshake := append(zmqpub.Greeting(), zmqpub.Ready("PUB")...)
	after := func(b ...[]byte) []byte {
		out := append([]byte{}, handshake...)
		for _, x := range b {
			out = append(out, x...)
		}
		return out
	}
	nineFrames := make([][]byte, 9)
	for i := range nineFrames {
		nineFrames[i] = []byte("f")
	}

	cases := []struct {
		name, reason string
		data         []byte
		python       bool // written by the python process instead of Go
	}{
		{"random bytes", ConnHandshake, random, false},
		{"random bytes from another process", ConnHandshake, random[:1000], true},
		{"ZMTP 2.0 greeting", ConnHandshake, append(oldGreeting, zmqpub.Ready("PUB")...), false},
		// zmq4 panics on both READYs below (a property cut short; an unknown
		// Socket-Type); the panic must become a counted handshake error.
		{"READY with a truncated property", ConnHandshake, append(zmqpub.Greeting(), zmqpub.Command("READY", []byte("\x03abc"))...), false},
		{"READY of an unknown socket type", ConnHandshake, append(zmqpub.Greeting(), zmqpub.Ready("BOGUS")...), false},
		{"READY of an incompatible socket type", ConnHandshake, append(zmqpub.Greeting(), zmqpub.Ready("PULL")...), false},
		{"frame header announcing 2^50 bytes in the handshake", ConnOversize, append(zmqpub.Greeting(), hugeFrame...), false},
		{"reserved flag bits", ConnProtocol, after([]byte{0xf0, 1, 'x'}), false},
		{"too many frames in one message", ConnProtocol, after(zmqpub.Message(nineFrames...)), false},
		{"command inside a multipart message", ConnProtocol, after(zmqpub.Frame([]byte("kv@"), true), zmqpub.Command("PING", nil)), false},
		{"long frame header announcing 2^63+1 bytes", ConnOversize, after(zmqpub.FrameHeader(1<<63+1, 0)), false},
		{"random bytes after the handshake", "", after([]byte{0x01, 0x03, 'k', 'v', '@'}, random), false},
	}

	s, reg := newSub(t, nil)
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()

	errorsBy := func(reason string) float64 {
		return counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": reason, "source": ep})
	}
	allErrors := func() float64 {
		n := 0.0
		for _, r := range []string{ConnHandshake, ConnOversize, ConnProtocol, ConnClosed} {
			n += errorsBy(r)
		}
		return n
	}
	for i, tc := range cases {
		before, total := errorsBy(tc.reason), allErrors()
		if tc.python {
			p.Raw(ep, tc.data)
		} else {
			c := zmqpub.Dial(t, ep)
			if _, err := c.Write(tc.data); err != nil && !isReset(err) {
				t.Fatalf("%s: write: %v", tc.name, err)
			}
		}
		waitFor(t, tc.name+": counted", func() bool {
			if tc.reason == "" { // whatever the garbage turns out to be
				return allErrors() > total
			}
			return errorsBy(tc.reason) == before+1
		})
		// The real publisher still gets through after each.
		p.Send(msg(uint64(i))...)
		var got Message
		for { // random bytes after the handshake may parse as messages
			got = recv(t, s, 1)[0]
			if got.Peer != "" && sameFrames(got.Frames, msg(uint64(i))) {
				break
			}
		}
	}
}

// isReset reports a network error such as a reset by the peer, which
// closing a socket with unread data causes.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// zmq4 panics on some hostile READY commands; openZMTP turns the panic into
// an ErrProtocol error.
func TestOpenZMTPRecoversZmq4Panics(t *testing.T) {
	for name, ready := range map[string][]byte{
		"truncated property":  zmqpub.Command("READY", []byte("\x03abc")),
		"unknown socket type": zmqpub.Ready("BOGUS"),
	} {
		ep := zmqpub.Serve(t, func(c net.Conn) {
			_, _ = c.Write(append(zmqpub.Greeting(), ready...))
			_, _ = io.Copy(io.Discard, c)
		})
		nc, err := net.Dial("tcp", ep[len("tcp://"):])
		if err != nil {
			t.Fatal(err)
		}
		_, err = openZMTP(nc, zmq4.Sub, false)
		_ = nc.Close()
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "panicked") {
			t.Errorf("%s: err %v; want a recovered zmq4 panic", name, err)
		}
	}
}

// Every receive error is treated alike: a publisher that dies in the middle
// of a frame (io.ErrUnexpectedEOF, which zmq4's own reconnect misses) and
// one that never finishes the handshake are both re-dialled.
func TestReconnectAfterAnyError(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	ep := zmqpub.Serve(t, func(c net.Conn) {
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		switch n {
		case 1: // silent: the handshake times out
			_, _ = io.Copy(io.Discard, c)
			return
		case 2: // dies mid-frame
			// Reading the subscription first makes the close a clean FIN
			// after the partial frame, not a reset.
			sub := make([]byte, len(zmqpub.Message([]byte("\x01kv@"))))
			if zmqpub.Handshake(c, "PUB") == nil {
				if _, err := io.ReadFull(c, sub); err == nil {
					_, _ = c.Write(append(zmqpub.FrameHeader(100, 0), "only ten b"...))
				}
			}
			_ = c.Close()
			return
		}
		if zmqpub.Handshake(c, "PUB") == nil {
			_, _ = c.Write(zmqpub.Message(msg(3)...))
		}
		_, _ = io.Copy(io.Discard, c)
	})
	s, reg := newSub(t, func(o *Options) { o.HandshakeTimeout = 100 * time.Millisecond })
	if err := s.Connect(ep); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, s, 1)[0]; !sameFrames(m.Frames, msg(3)) || m.Source != ep {
		t.Fatalf("got %q from %s", m.Frames, m.Source)
	}
	for _, reason := range []string{ConnHandshake, ConnClosed} {
		if v := counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": reason, "source": ep}); v != 1 {
			t.Errorf("connection_errors{%s} = %v; want 1", reason, v)
		}
	}
}

// A bound address takes at most MaxPeers publishers at once.
func TestMaxPeers(t *testing.T) {
	s, reg := newSub(t, func(o *Options) { o.MaxPeers = 1 })
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	c := zmqpub.Dial(t, ep)
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("second peer: read %d bytes, %v; want the connection closed", n, err)
	}
	if v := counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnTooMany, "source": ep}); v != 1 {
		t.Fatalf("connection_errors{too_many} = %v; want 1", v)
	}
	p.Send(msg(1)...)
	recv(t, s, 1)
}
