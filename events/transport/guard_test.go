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

// guardOptions are DefaultOptions with the guard's limits set.
func guardOptions(maxFrame int64, maxFrames int) Options {
	o := DefaultOptions()
	o.ReadBufferSize = minReadBuffer
	o.MaxFrameBytes = maxFrame
	o.MaxFrames = maxFrames
	return o
}

// readThroughGuard reads messages from stream through a guard and zmq4
// (without the panic net of recvMsg) until an error.
func readThroughGuard(t testing.TB, stream io.Reader, maxFrame int64, maxFrames int) ([][][]byte, error) {
	msgs, _, err := readThroughGuardWith(t, streamConn{stream}, guardOptions(maxFrame, maxFrames), &budget{limit: 1 << 40})
	return msgs, err
}

// readThroughGuardWith reads messages from c through a guard with these
// options and budget, armed after the handshake, until an error. It
// releases each message's reservation as it goes and returns which
// messages were dropped for lack of memory.
func readThroughGuardWith(t testing.TB, c net.Conn, o Options, mem *budget) (msgs [][][]byte, dropped []bool, err error) {
	g := newGuardConn(c, o, mem)
	defer g.release()
	zc, err := zmq4.Open(g, null.Security(), zmq4.Sub, nil, false, nil)
	n, _ := g.take()
	mem.release(n)
	if err != nil {
		return nil, nil, err
	}
	g.arm(o.MessageTimeout)
	for {
		m, err := zc.RecvMsg()
		n, drop := g.take()
		mem.release(n)
		if err != nil {
			return msgs, dropped, err
		}
		if m.Type == zmq4.CmdMsg {
			continue
		}
		size := int64(0)
		for _, f := range m.Frames {
			if int64(len(f)) > o.MaxFrameBytes {
				t.Fatalf("a %d-byte frame passed a %d-byte guard", len(f), o.MaxFrameBytes)
			}
			size += int64(len(f))
		}
		if !drop && n != size {
			t.Fatalf("the guard reserved %d bytes for a message of %d", n, size)
		}
		msgs = append(msgs, m.Frames)
		dropped = append(dropped, drop)
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
// guard, without recvMsg's panic net: nothing may panic, no frame over the
// limit may come out, and what the guard reserves matches what comes out,
// with a budget that holds everything and with one that holds little.
func FuzzGuard(f *testing.F) {
	f.Add(zmqpub.Message([]byte("kv@127.0.0.1:8001@sim-model"), seqFrame(1), []byte("\x93\xcbA\xda")))
	f.Add(zmqpub.FrameHeader(1<<50, 0))
	f.Add(zmqpub.Command("PING", []byte("\x00\x0a")))
	f.Add([]byte{0xf0, 1, 'x'})
	f.Add(zmqpub.Message([]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e")))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = readThroughGuard(t, bytes.NewReader(publisherStream(data)), 512, 4)
		mem := &budget{limit: 64}
		_, _, _ = readThroughGuardWith(t, streamConn{bytes.NewReader(publisherStream(data))}, guardOptions(512, 4), mem)
		if n := mem.used.Load(); n != 0 {
			t.Fatalf("%d bytes still reserved", n)
		}
	})
}

// A message frame the budget cannot hold is read past, never stored: zmq4
// gets an empty stand-in for it and for the rest of its message, the guard
// reports the message dropped, and the next message passes whole.
func TestGuardDropsWhatTheBudgetCannotHold(t *testing.T) {
	topic := []byte("kv@a@m")
	fits := [][]byte{topic, seqFrame(1), bytes.Repeat([]byte("a"), 50)}
	big := [][]byte{topic, bytes.Repeat([]byte("b"), 200), seqFrame(2), []byte("after the frame that did not fit")}
	stream := publisherStream(zmqpub.Message(fits...), zmqpub.Message(big...), zmqpub.Message(fits...))
	for name, r := range map[string]func() io.Reader{
		"whole":       func() io.Reader { return bytes.NewReader(stream) },
		"byte a time": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(stream)) },
	} {
		mem := &budget{limit: 100}
		got, dropped, err := readThroughGuardWith(t, streamConn{r()}, guardOptions(1000, 4), mem)
		if !errors.Is(err, io.EOF) || len(got) != 3 {
			t.Fatalf("%s: %d messages, %v; want 3 and EOF", name, len(got), err)
		}
		if dropped[0] || dropped[2] || !sameFrames(got[0], fits) || !sameFrames(got[2], fits) {
			t.Fatalf("%s: the messages that fit: dropped %v, %q", name, dropped, got)
		}
		if !dropped[1] || !sameFrames(got[1], [][]byte{topic, {}, {}, {}}) {
			t.Fatalf("%s: the message that does not fit: dropped %v, frames %q; want the topic, then empty stand-ins", name, dropped[1], got[1])
		}
		if n := mem.used.Load(); n != 0 {
			t.Fatalf("%s: %d bytes still reserved", name, n)
		}
	}
}

// The frames of one message together may announce MaxFrameBytes plus
// messageAllowance, each frame within MaxFrameBytes.
func TestGuardRefusesOversizeMessage(t *testing.T) {
	const frame = messageAllowance
	three := zmqpub.Message(make([]byte, frame), make([]byte, frame), make([]byte, frame))
	mem := &budget{limit: 1 << 30}
	_, _, err := readThroughGuardWith(t, streamConn{bytes.NewReader(publisherStream(three))}, guardOptions(frame, 8), mem)
	if !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("three frames of %d bytes: %v; want ErrMessageTooLarge", frame, err)
	}
	if n := mem.used.Load(); n != 0 {
		t.Fatalf("%d bytes still reserved after the refusal", n)
	}
	two := zmqpub.Message(make([]byte, frame), make([]byte, frame))
	got, _, err := readThroughGuardWith(t, streamConn{bytes.NewReader(publisherStream(two))}, guardOptions(frame, 8), mem)
	if !errors.Is(err, io.EOF) || len(got) != 1 {
		t.Fatalf("two frames of %d bytes: %d messages, %v; want 1 and EOF", frame, len(got), err)
	}
}

// deadlineConn is a streamConn that counts the read deadlines set and
// cleared.
type deadlineConn struct {
	streamConn
	sets, clears *int
}

func (c deadlineConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		*c.clears++
	} else {
		*c.sets++
	}
	return nil
}

// A message that is in the read buffer costs no deadline; one the guard
// has to wait for costs one, cleared when it ends. The handshake, timed by
// its owner, costs none.
func TestGuardSetsDeadlinesOnlyWhenWaiting(t *testing.T) {
	const messages = 2000
	one := zmqpub.Message([]byte("kv@a@m"), seqFrame(1), bytes.Repeat([]byte("p"), 1000))
	stream := publisherStream(bytes.Repeat(one, messages))
	for _, tc := range []struct {
		name    string
		r       io.Reader
		buf     int
		minSets int
		maxSets int
	}{
		// A fill of the 64 KiB buffer ends inside at most one message.
		{"buffered", bytes.NewReader(stream), 64 << 10, 1, len(stream)/(64<<10) + 1},
		{"byte a time", iotest.OneByteReader(bytes.NewReader(stream)), 64 << 10, messages, messages},
	} {
		var sets, clears int
		o := guardOptions(4096, 3)
		o.ReadBufferSize = tc.buf
		got, _, err := readThroughGuardWith(t, deadlineConn{streamConn{tc.r}, &sets, &clears}, o, &budget{limit: 1 << 30})
		if !errors.Is(err, io.EOF) || len(got) != messages {
			t.Fatalf("%s: %d messages, %v", tc.name, len(got), err)
		}
		if sets < tc.minSets || sets > tc.maxSets || clears != sets {
			t.Fatalf("%s: %d deadlines set, %d cleared; want %d to %d, each cleared", tc.name, sets, clears, tc.minSets, tc.maxSets)
		}
	}
}
