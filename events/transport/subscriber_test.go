package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// Publishers that connect to prefixd's bound SUB, as llm-d-inference-sim
// does: two at once, each sending a recording, both arrive byte for byte.
func TestBoundSUBReceivesRecordingsByteForByte(t *testing.T) {
	files := []string{
		fixture.Path(t, "a_array_random_seedless", "events.jsonl"),
		fixture.Path(t, "b_map_affinity_seed42_sleepwake", "events.jsonl"),
		fixture.Path(t, "c_dp2_late_subscriber_restart", "replay-rank0-from-0.jsonl"),
	}
	s, reg := newSub(t, nil)
	ep := bind(t, s)

	total := 0
	pubs := make([]*zmqpub.Publisher, len(files))
	want := make([][][][]byte, len(files))
	for i, f := range files {
		pubs[i] = zmqpub.Start(t)
		pubs[i].Connect(ep)
		if sub := pubs[i].WaitSubscribed(); string(sub) != "\x01kv@" {
			t.Fatalf("subscription %q; want \"\\x01kv@\"", sub)
		}
		want[i] = liveFrames(t, f)
		total += len(want[i])
	}
	for i, f := range files {
		if n := pubs[i].SendFile(f); n != len(want[i]) {
			t.Fatalf("%s: published %d messages; want %d", f, n, len(want[i]))
		}
	}

	byPeer := map[string][]Message{}
	for _, m := range recv(t, s, total) {
		if m.Source != ep {
			t.Fatalf("source %q; want the bound endpoint %q", m.Source, ep)
		}
		if m.Resync || m.RecvTime.IsZero() {
			t.Fatalf("message with Resync %v, RecvTime %v", m.Resync, m.RecvTime)
		}
		byPeer[m.Peer] = append(byPeer[m.Peer], m)
	}
	if len(byPeer) != len(files) {
		t.Fatalf("messages from %d peers; want %d", len(byPeer), len(files))
	}
	// Each peer's stream is one recording, in order.
	for peer, got := range byPeer {
		matched := false
		for i := range want {
			if len(got) == len(want[i]) && sameFrames(got[0].Frames, want[i][0]) {
				checkStream(t, peer, got, want[i])
				matched = true
			}
		}
		if !matched {
			t.Fatalf("peer %s sent %d messages that match no recording", peer, len(got))
		}
	}
	// Counted just after queueing: the count may trail by a moment.
	waitFor(t, "prefixd_ingest_messages_total to count every message", func() bool {
		return counter(t, reg, "prefixd_ingest_messages_total", map[string]string{"source": ep}) == float64(total)
	})
	if v := counter(t, reg, "prefixd_ingest_connections", map[string]string{"source": ep}); v != float64(len(files)) {
		t.Fatalf("prefixd_ingest_connections = %v; want %d", v, len(files))
	}
}

// Publishers that bind, as vLLM does with tcp://*:port: one connection per
// endpoint, messages identified by the endpoint.
func TestConnectingSUBReceivesRecordingsByteForByte(t *testing.T) {
	files := []string{
		fixture.Path(t, "c_dp2_late_subscriber_restart", "replay-rank0-from-0.jsonl"),
		fixture.Path(t, "c_dp2_late_subscriber_restart", "replay-rank1-from-0.jsonl"),
		fixture.Path(t, "a_array_random_seedless", "events.jsonl"),
	}
	s, _ := newSub(t, nil)
	pubs := make([]*zmqpub.Publisher, len(files))
	eps := make([]string, len(files))
	for i := range files {
		pubs[i] = zmqpub.Start(t)
		eps[i] = pubs[i].Bind("tcp://127.0.0.1:0")
		if err := s.Connect(eps[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Connect(eps[0]); err != nil { // a second Connect is a no-op
		t.Fatal(err)
	}
	total := 0
	want := map[string][][][]byte{}
	for i, f := range files {
		pubs[i].WaitSubscribed()
		want[eps[i]] = liveFrames(t, f)
		total += len(want[eps[i]])
		pubs[i].SendFile(f)
	}
	bySource := map[string][]Message{}
	for _, m := range recv(t, s, total) {
		bySource[m.Source] = append(bySource[m.Source], m)
	}
	for ep, w := range want {
		checkStream(t, ep, bySource[ep], w)
	}
	if got := s.Endpoints(); len(got) != len(files) {
		t.Fatalf("Endpoints() = %q; want %d", got, len(files))
	}
}

// A bound publisher that dies and comes back on the same port is
// reconnected to, at its own endpoint, while the other endpoint of the same
// Subscriber carries on. (zmq4's own reconnect re-dials the socket's last
// endpoint instead.)
func TestConnectingSUBReconnectsAfterPublisherRestart(t *testing.T) {
	s, reg := newSub(t, nil)
	a, b := zmqpub.Start(t), zmqpub.Start(t)
	epA, epB := a.Bind("tcp://127.0.0.1:0"), b.Bind("tcp://127.0.0.1:0")
	for _, ep := range []string{epA, epB} {
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	a.WaitSubscribed()
	b.WaitSubscribed()
	a.Send(msg(1)...)
	b.Send(msg(1)...)
	recv(t, s, 2)

	a.Kill()
	b.Send(msg(2)...)
	if m := recv(t, s, 1)[0]; m.Source != epB || !sameFrames(m.Frames, msg(2)) {
		t.Fatalf("after A died: message from %s %q; want seq 2 from %s", m.Source, m.Frames, epB)
	}

	a2 := zmqpub.Start(t)
	if got := a2.Bind(epA); got != epA {
		t.Fatalf("restarted publisher bound %s; want %s", got, epA)
	}
	a2.WaitSubscribed()
	a2.Send(msg(1)...)
	if m := recv(t, s, 1)[0]; m.Source != epA || !sameFrames(m.Frames, msg(1)) {
		t.Fatalf("after A restarted: message from %s %q; want seq 1 from %s", m.Source, m.Frames, epA)
	}
	if v := counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnClosed, "source": epA}); v < 1 {
		t.Fatalf("connection_errors{closed,%s} = %v; want >= 1", epA, v)
	}

	if !s.Disconnect(epA) || s.Disconnect(epA) {
		t.Fatal("Disconnect: want true, then false")
	}
	b.Send(msg(3)...)
	if m := recv(t, s, 1)[0]; m.Source != epB {
		t.Fatalf("after Disconnect(A): message from %s; want %s", m.Source, epB)
	}
}

// A publisher connected to the bound SUB restarts (a sim restart): the new
// process's connection is accepted like the first.
func TestBoundSUBAcceptsRestartedPublisher(t *testing.T) {
	s, reg := newSub(t, nil)
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	p.Send(msg(1)...)
	first := recv(t, s, 1)[0]
	p.Kill()

	p2 := zmqpub.Start(t)
	p2.Connect(ep)
	p2.WaitSubscribed()
	p2.Send(msg(1)...)
	second := recv(t, s, 1)[0]
	if first.Peer == second.Peer || !sameFrames(second.Frames, msg(1)) {
		t.Fatalf("second publisher: peer %s (first %s), frames %q", second.Peer, first.Peer, second.Frames)
	}
	waitFor(t, "the first connection counted as closed", func() bool {
		return counter(t, reg, "prefixd_ingest_connection_errors_total", map[string]string{"reason": ConnClosed, "source": ep}) == 1
	})
}

// A full queue drops without blocking the receive loop, counts, and flags
// the connection's next queued message with Resync.
func TestQueueFullDropsCountsAndFlagsResync(t *testing.T) {
	const size, sent = 4, 20
	s, reg := newSub(t, func(o *Options) { o.QueueSize = size })
	ep := bind(t, s)
	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	for i := uint64(1); i <= sent; i++ {
		p.Send(msg(i)...)
	}
	dropped := map[string]string{"reason": DropQueueFull, "source": ep}
	waitFor(t, "every message queued or dropped", func() bool {
		return counter(t, reg, "prefixd_ingest_dropped_total", dropped) == sent-size
	})
	for i, m := range recv(t, s, size) {
		if m.Resync || !sameFrames(m.Frames, msg(uint64(i+1))) {
			t.Fatalf("queued message %d: Resync %v, seq frame %x", i, m.Resync, m.Frames[1])
		}
	}
	p.Send(msg(sent + 1)...)
	p.Send(msg(sent + 2)...)
	got := recv(t, s, 2)
	if !got[0].Resync || !sameFrames(got[0].Frames, msg(sent+1)) {
		t.Fatalf("first message after the drops: Resync %v, seq frame %x; want Resync and seq %d", got[0].Resync, got[0].Frames[1], sent+1)
	}
	if got[1].Resync {
		t.Fatal("second message after the drops has Resync; want it cleared")
	}
	// The receive loop counts a message just after it queues it, so the
	// count may trail what the test has received by a moment.
	waitFor(t, "messages_total to count the queued messages", func() bool {
		return counter(t, reg, "prefixd_ingest_messages_total", map[string]string{"source": ep}) == size+2
	})
}

// The topic prefix is sent as a subscription and checked again locally,
// since a publisher may ignore subscriptions; "" takes everything.
func TestTopicFilter(t *testing.T) {
	ignoring := zmqpub.Serve(t, func(c net.Conn) {
		if zmqpub.Handshake(c, "PUB") != nil {
			return
		}
		_, _ = c.Write(zmqpub.Message([]byte("other@x"), seqFrame(1), []byte("p")))
		_, _ = c.Write(zmqpub.Message([]byte("kv@x"), seqFrame(2), []byte("p")))
		_, _ = c.Read(make([]byte, 1)) // hold the connection until closed
	})
	s, reg := newSub(t, nil)
	if err := s.Connect(ignoring); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, s, 1)[0]; string(m.Frames[0]) != "kv@x" {
		t.Fatalf("got topic %q; want kv@x", m.Frames[0])
	}
	if v := counter(t, reg, "prefixd_ingest_dropped_total", map[string]string{"reason": DropTopic, "source": ignoring}); v != 1 {
		t.Fatalf("dropped{topic_filter} = %v; want 1", v)
	}

	all, _ := newSub(t, func(o *Options) { o.Topic = "" })
	ep := bind(t, all)
	p := zmqpub.Start(t)
	p.Connect(ep)
	if sub := p.WaitSubscribed(); string(sub) != "\x01" {
		t.Fatalf("subscription %q; want everything (\\x01)", sub)
	}
	p.Send([]byte{}, seqFrame(7), []byte("vllm default topic"))
	if m := recv(t, all, 1)[0]; len(m.Frames[0]) != 0 || string(m.Frames[2]) != "vllm default topic" {
		t.Fatalf("got %q", m.Frames)
	}
}

func TestSubscriberLifecycle(t *testing.T) {
	s, err := NewSubscriber(testOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Bind("udp://127.0.0.1:0"); err == nil {
		t.Fatal("Bind(udp://...) succeeded")
	}
	if err := s.Connect("tcp://127.0.0.1:0"); err == nil {
		t.Fatal("Connect to port 0 succeeded")
	}
	if err := s.Connect("tcp://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- s.Run(t.Context()) }()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after Close", err)
	}
	_ = s.Close() // idempotent
	if _, ok := <-s.Messages(); ok {
		t.Fatal("queue still open after Close")
	}
	if err := s.Connect("tcp://127.0.0.1:2"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Connect after Close: %v; want ErrClosed", err)
	}
	if _, err := s.Bind("tcp://127.0.0.1:0"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Bind after Close: %v; want ErrClosed", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("DefaultOptions: %v", err)
	}
	for name, edit := range map[string]func(*Options){
		"queue":     func(o *Options) { o.QueueSize = 0 },
		"frame":     func(o *Options) { o.MaxFrameBytes = 0 },
		"frames":    func(o *Options) { o.MaxFrames = 0 },
		"buffer":    func(o *Options) { o.ReadBufferSize = 8 },
		"dial":      func(o *Options) { o.DialTimeout = 0 },
		"handshake": func(o *Options) { o.HandshakeTimeout = -1 },
		"backoff":   func(o *Options) { o.MinBackoff = 0 },
		"order":     func(o *Options) { o.MaxBackoff = o.MinBackoff / 2 },
		"peers":     func(o *Options) { o.MaxPeers = 0 },
		"per host":  func(o *Options) { o.MaxConnsPerHost = 0 },
		"message":   func(o *Options) { o.MessageTimeout = 0 },
		"budget":    func(o *Options) { o.MaxBufferedBytes = o.MaxFrameBytes },
	} {
		o := DefaultOptions()
		edit(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, o)
		}
		if _, err := NewSubscriber(o, nil); err == nil {
			t.Errorf("%s: NewSubscriber accepted invalid options", name)
		}
	}
}

func TestSplitEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep            string
		bind          bool
		network, addr string
		wantErr       bool
	}{
		{ep: "tcp://127.0.0.1:5557", network: "tcp", addr: "127.0.0.1:5557"},
		{ep: "tcp://[::1]:5557", network: "tcp", addr: "[::1]:5557"},
		{ep: "tcp://*:5557", bind: true, network: "tcp", addr: ":5557"},
		{ep: "tcp://127.0.0.1:*", bind: true, network: "tcp", addr: "127.0.0.1:0"},
		{ep: "ipc:///tmp/kv.sock", network: "unix", addr: "/tmp/kv.sock"},
		{ep: "tcp://*:5557", wantErr: true},
		{ep: "tcp://host", wantErr: true},
		{ep: "127.0.0.1:5557", wantErr: true},
		{ep: "inproc://x", wantErr: true},
		{ep: "ipc://", wantErr: true},
	} {
		network, addr, err := splitEndpoint(tc.ep, tc.bind)
		if (err != nil) != tc.wantErr || network != tc.network || addr != tc.addr {
			t.Errorf("splitEndpoint(%q, %v) = %q, %q, %v", tc.ep, tc.bind, network, addr, err)
		}
	}
}

// msg is a KV-event-shaped message with the given seq.
func msg(seq uint64) [][]byte {
	return [][]byte{[]byte("kv@127.0.0.1:8001@sim-model"), seqFrame(seq), []byte(fmt.Sprintf("payload %d", seq))}
}

func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

func TestBackoff(t *testing.T) {
	b := backoff{min: 10 * time.Millisecond, max: 80 * time.Millisecond}
	for i, step := range []time.Duration{10, 20, 40, 80, 80, 80} {
		step *= time.Millisecond
		if d := b.next(); d < step/2 || d > step {
			t.Fatalf("wait %d: %v; want within [%v, %v]", i, d, step/2, step)
		}
	}
	b.reset()
	if d := b.next(); d > 10*time.Millisecond {
		t.Fatalf("after reset: %v; want <= 10ms", d)
	}
}

// ipc:// endpoints work in both topologies.
func TestIPCEndpoints(t *testing.T) {
	dir := t.TempDir()
	s, _ := newSub(t, nil)
	bound, err := s.Bind("ipc://" + dir + "/sub.sock")
	if err != nil {
		t.Fatal(err)
	}
	a := zmqpub.Start(t)
	a.Connect(bound)
	b := zmqpub.Start(t)
	published := b.Bind("ipc://" + dir + "/pub.sock")
	if err := s.Connect(published); err != nil {
		t.Fatal(err)
	}
	a.WaitSubscribed()
	b.WaitSubscribed()
	a.Send(msg(1)...)
	b.Send(msg(2)...)
	sources := map[string]bool{}
	for _, m := range recv(t, s, 2) {
		sources[m.Source] = true
	}
	if !sources[bound] || !sources[published] {
		t.Fatalf("messages from %v; want %s and %s", sources, bound, published)
	}
}

// A connection that delivered messages and ends is reported once, after
// its messages, by a Closed notice naming its source and peer, for bound
// and connected endpoints alike; a connection that delivered nothing is
// not reported.
func TestClosedConnectionsNoticed(t *testing.T) {
	s, _ := newSub(t, nil)
	ep := bind(t, s)
	silent := zmqpub.Dial(t, ep)
	if err := zmqpub.Handshake(silent, "PUB"); err != nil {
		t.Fatal(err)
	}
	_ = silent.Close() // delivered nothing: no notice

	p := zmqpub.Start(t)
	p.Connect(ep)
	p.WaitSubscribed()
	p.Send(msg(1)...)
	got := recvAll(t, s, 1, true) // before the kill, which would lose what libzmq has not sent
	p.Kill()
	got = append(got, recvAll(t, s, 1, true)...)
	if got[0].Closed || !got[1].Closed || got[1].Source != ep || got[1].Peer != got[0].Peer || !got[1].Inbound || len(got[1].Frames) != 0 {
		t.Fatalf("bound: got %+v, then %+v; want the message, then a Closed notice of its connection", got[0], got[1])
	}

	q := zmqpub.Start(t)
	pub := q.Bind("tcp://127.0.0.1:0")
	if err := s.Connect(pub); err != nil {
		t.Fatal(err)
	}
	q.WaitSubscribed()
	q.Send(msg(1)...)
	got = recvAll(t, s, 1, true)
	q.Kill()
	got = append(got, recvAll(t, s, 1, true)...)
	if got[0].Closed || !got[1].Closed || got[1].Source != pub || got[1].Inbound {
		t.Fatalf("connected: got %+v, then %+v; want the message, then a Closed notice of %s", got[0], got[1], pub)
	}
	select {
	case m := <-s.Messages():
		if m.Closed {
			t.Fatalf("a second notice: %+v", m)
		}
	case <-time.After(200 * time.Millisecond):
	}
}
