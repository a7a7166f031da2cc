package transport

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixd/prefixd/testutil/zmqpub"
)

const (
	benchPayload = 1024 // bytes of msgpack payload per message
	benchQueue   = 1 << 16
)

var benchTopic = []byte("kv@127.0.0.1:8001@sim-model")

// BenchmarkIngest measures messages a second from a real loopback TCP
// socket into the queue, drained by one consumer, for ~1 KiB messages. Run
// it with -cpu 1 to hold prefixd to one core:
//
//	go test -run '^$' -bench Ingest -cpu 1 ./events/transport/
//
// Publishers:
//   - libzmq: scripts/zmqpub.py (pyzmq on libzmq 4.3), a separate process,
//     so it does not share the core; it is also the slower side.
//   - libzmq-x2: two of them at once, as a fleet has many, each on its
//     own connection; the machine's other core runs both.
//   - go-zmtp: an in-process Go writer of pre-encoded ZMTP frames (the bytes
//     libzmq sends); it shares prefixd's core, kernel send work included.
//
// buf is the guard's read buffer; 16 bytes stands for zmq4 reading the
// socket unbuffered.
func BenchmarkIngest(b *testing.B) {
	b.Run("pub=libzmq/buf=64KiB", func(b *testing.B) { benchLibzmq(b, 64<<10, 1) })
	b.Run("pub=libzmq-x2/buf=64KiB", func(b *testing.B) { benchLibzmq(b, 64<<10, 2) })
	b.Run("pub=go-zmtp/buf=64KiB", func(b *testing.B) { benchGoZMTP(b, 64<<10) })
	b.Run("pub=go-zmtp/buf=16B", func(b *testing.B) { benchGoZMTP(b, minReadBuffer) })
}

func benchSubscriber(b *testing.B, buf int) *Subscriber {
	o := testOptions()
	o.QueueSize = benchQueue
	o.ReadBufferSize = buf
	s, err := NewSubscriber(o, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// drain receives and releases n messages and reports the rate; it fails
// when messages stop coming (dropped for a full queue, which the rate
// would hide).
func drain(b *testing.B, s *Subscriber, n int) {
	b.Helper()
	stall := time.NewTimer(5 * time.Second)
	defer stall.Stop()
	for i := range n {
		select {
		case m := <-s.Messages():
			if m.Resync {
				b.Fatalf("message %d came after drops: the queue was full", i)
			}
			m.Release()
		case <-stall.C:
			b.Fatalf("stalled after %d of %d messages", i, n)
		}
		if i%4096 == 0 {
			stall.Reset(5 * time.Second)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

func benchLibzmq(b *testing.B, buf, pubs int) {
	s := benchSubscriber(b, buf)
	ps := make([]*zmqpub.Publisher, pubs)
	for i := range ps {
		ps[i] = zmqpub.Start(b)
		if err := s.Connect(ps[i].Bind("tcp://127.0.0.1:0")); err != nil {
			b.Fatal(err)
		}
		ps[i].WaitSubscribed()
	}
	b.SetBytes(int64(len(benchTopic) + 8 + benchPayload))
	b.ReportAllocs()
	b.ResetTimer()
	sent := make(chan string, pubs)
	for i, p := range ps {
		n := b.N / pubs
		if i == 0 {
			n += b.N % pubs
		}
		go func() {
			out, err := p.Do(fmt.Sprintf("bench %d %d", n, benchPayload))
			if err != nil {
				out = err.Error()
			}
			sent <- out
		}()
	}
	drain(b, s, b.N)
	// The publishers' own send rate says which side was the bottleneck.
	slowest := 0.0
	for range pubs {
		out := <-sent
		secs, err := strconv.ParseFloat(out, 64)
		if err != nil {
			b.Fatalf("bench: %s", out)
		}
		slowest = max(slowest, secs)
	}
	b.ReportMetric(float64(b.N)/slowest, "pub-msgs/s")
}

func benchGoZMTP(b *testing.B, buf int) {
	const perChunk = 64
	msg := zmqpub.Message(benchTopic, seqFrame(1), bytes.Repeat([]byte{0xa5}, benchPayload))
	chunk := bytes.Repeat(msg, perChunk)
	n := b.N
	start := make(chan struct{})
	ep := zmqpub.Serve(b, func(c net.Conn) {
		if zmqpub.Handshake(c, "PUB") != nil {
			return
		}
		<-start
		for left := n; left > 0; left -= perChunk {
			k := min(left, perChunk)
			if _, err := c.Write(chunk[:k*len(msg)]); err != nil {
				return
			}
		}
		_, _ = io.Copy(io.Discard, c)
	})
	s := benchSubscriber(b, buf)
	if err := s.Connect(ep); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchTopic) + 8 + benchPayload))
	b.ReportAllocs()
	b.ResetTimer()
	close(start)
	drain(b, s, n)
}

// loopReader reads the stream after a handshake forever.
type loopReader struct {
	handshake, stream []byte
	off               int
}

func (r *loopReader) Read(p []byte) (int, error) {
	if len(r.handshake) > 0 {
		n := copy(p, r.handshake)
		r.handshake = r.handshake[n:]
		return n, nil
	}
	n := copy(p, r.stream[r.off:])
	r.off = (r.off + n) % len(r.stream)
	return n, nil
}

// BenchmarkGuard measures what the receive loop spends on one ~1 KiB
// message apart from the network: the guard's checks and accounting,
// zmq4's decoding, and the message's lease, taken and released.
func BenchmarkGuard(b *testing.B) {
	one := zmqpub.Message(benchTopic, seqFrame(1), bytes.Repeat([]byte{0xa5}, benchPayload))
	r := &loopReader{handshake: publisherStream(), stream: bytes.Repeat(one, 1000)}
	o := DefaultOptions()
	mem := &budget{limit: o.MaxBufferedBytes}
	g := newGuardConn(streamConn{r}, o, mem)
	zc, err := openZMTP(g, zmq4.Sub, false)
	if err != nil {
		b.Fatal(err)
	}
	g.take()
	g.arm(o.MessageTimeout)
	var ls leases
	b.SetBytes(int64(len(benchTopic) + 8 + benchPayload))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := recvMsg(zc); err != nil {
			b.Fatal(err)
		}
		n, _ := g.take()
		m := Message{lease: ls.take(mem, n)}
		m.Release()
	}
}
