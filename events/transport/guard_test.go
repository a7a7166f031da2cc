package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// streamConn is a net.Conn that reads a fixed stream and discards writes.
type streamConn struct{ r io.Reader }

func (c streamConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (streamConn) Write(p []byte) (int, error)      { return len(p), nil }
func (streamConn) Close() error                     { return nil }
func (streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (streamConn) SetDeadline(time.Time) error      { return nil }
func (streamConn) SetReadDeadline(time.Time) error  { return nil }
func (streamConn) SetWriteDeadline(time.Time) error { return nil }

// publisherStream is what a PUB sends a SUB: greeting, READY, then rest.
func publisherStream(rest ...[]byte) []byte {
	b := append(zmqpub.Greeting(), zmqpub.Ready("PUB")...)
	for _, r := range rest {
		b = append(b, r...)
	}
	return b
}

// readThroughGuard reads messages from stream through a guard and zmq4
// (without the panic net of recvMsg) until an error.
func readThroughGuard(t testing.TB, stream io.Reader, maxFrame int64, maxFrames int) ([][][]byte, error) {
	g := newGuardConn(streamConn{stream}, minReadBuffer, maxFrame, maxFrames)
	zc, err := zmq4.Open(g, null.Security(), zmq4.Sub, nil, false, nil)
	if err != nil {
		return nil, err
	}
	var msgs [][][]byte
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			return msgs, err
		}
		if m.Type == zmq4.CmdMsg {
			continue
		}
		for _, f := range m.Frames {
			if int64(len(f)) > maxFrame {
				t.Fatalf("a %d-byte frame passed a %d-byte guard", len(f), maxFrame)
			}
		}
		msgs = append(msgs, m.Frames)
	}
}

func TestGuardPassesFramesWhole(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 1000)
	want := [][][]byte{
		{[]byte("kv@a@m"), seqFrame(1), long},
		{[]byte("kv@a@m"), seqFrame(2), {}},
		{{}},
	}
	var stream []byte
	for _, m := range want {
		stream = append(stream, zmqpub.Message(m...)...)
	}
	stream = append(stream, zmqpub.Command("PING", []byte("\x00\x0a"))...)
	stream = append(stream, zmqpub.Message(want[0]...)...)
	want = append(want, want[0])

	for name, r := range map[string]io.Reader{
		"whole":       bytes.NewReader(publisherStream(stream)),
		"byte a time": iotest.OneByteReader(bytes.NewReader(publisherStream(stream))),
		"half":        iotest.HalfReader(bytes.NewReader(publisherStream(stream))),
	} {
		got, err := readThroughGuard(t, r, 1000, 3)
		if !errors.Is(err, io.EOF) {
			t.Fatalf("%s: ended with %v; want EOF", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d messages; want %d", name, len(got), len(want))
		}
		for i := range want {
			if !sameFrames(got[i], want[i]) {
				t.Fatalf("%s: message %d: %q; want %q", name, i, got[i], want[i])
			}
		}
	}
}

func TestGuardRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream []byte
		want   error
	}{
		{"frame one byte over", zmqpub.Message(make([]byte, 101)), ErrFrameTooLarge},
		{"2^50 bytes", zmqpub.FrameHeader(1<<50, 0), ErrFrameTooLarge},
		{"2^64-1 bytes", zmqpub.FrameHeader(^uint64(0), 0), ErrFrameTooLarge},
		{"oversize command", zmqpub.Command("PING", make([]byte, 200)), ErrFrameTooLarge},
		{"reserved bits", []byte{0x08, 0}, ErrProtocol},
		{"too many frames", zmqpub.Message([]byte("a"), []byte("b"), []byte("c"), []byte("d")), ErrProtocol},
		{"command with more", []byte{0x05, 0}, ErrProtocol},
		{"command inside a message", append(zmqpub.Frame([]byte("a"), true), zmqpub.Command("PING", nil)...), ErrProtocol},
	} {
		_, err := readThroughGuard(t, bytes.NewReader(publisherStream(tc.stream)), 100, 3)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
	// A frame of exactly the limit passes.
	got, err := readThroughGuard(t, bytes.NewReader(publisherStream(zmqpub.Message(make([]byte, 100)))), 100, 3)
	if !errors.Is(err, io.EOF) || len(got) != 1 {
		t.Fatalf("frame at the limit: %d messages, %v", len(got), err)
	}
}

// FuzzGuard feeds arbitrary bytes after a good handshake to zmq4 through the
// guard, without recvMsg's panic net: nothing may panic and no frame over
// the limit may come out.
func FuzzGuard(f *testing.F) {
	f.Add(zmqpub.Message([]byte("kv@127.0.0.1:8001@sim-model"), seqFrame(1), []byte("\x93\xcbA\xda")))
	f.Add(zmqpub.FrameHeader(1<<50, 0))
	f.Add(zmqpub.Command("PING", []byte("\x00\x0a")))
	f.Add([]byte{0xf0, 1, 'x'})
	f.Add(zmqpub.Message([]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e")))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = readThroughGuard(t, bytes.NewReader(publisherStream(data)), 512, 4)
	})
}
