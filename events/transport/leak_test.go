package transport

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// 1,000 Subscribers connect and close against endpoints that are up (a real
// libzmq publisher), down (a closed port), silent (accepts, never speaks)
// and bound (publishers connecting to them), at every stage of the
// connection: no goroutine may be left behind.
func TestConnectCloseCyclesLeaveNoGoroutine(t *testing.T) {
	const cycles = 1000
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs after the helpers' own cleanups.
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

	p := zmqpub.Start(t)
	up := p.Bind("tcp://127.0.0.1:0")
	silent := zmqpub.Serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "tcp://" + l.Addr().String()
	_ = l.Close()

	for i := range cycles {
		s, err := NewSubscriber(testOptions(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range []string{up, down, silent} {
			if err := s.Connect(ep); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case i%25 == 0: // close once the live endpoint delivers
			if m := sendUntilReceived(t, p, s, msg(uint64(i))); m.Source != up {
				t.Fatalf("cycle %d: message from %s", i, m.Source)
			}
		case i%5 == 1: // a bound address with a publisher mid-handshake
			ep := bind(t, s)
			c := zmqpub.Dial(t, ep)
			_, _ = c.Write(zmqpub.Greeting())
		case i%5 == 2: // an endpoint removed before Close
			s.Disconnect(up)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// sendUntilReceived publishes frames again and again until s receives a
// message. WaitSubscribed cannot tell this subscriber's subscription from
// those of the Subscribers closed before it.
func sendUntilReceived(t *testing.T, p *zmqpub.Publisher, s *Subscriber, frames [][]byte) Message {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		p.Send(frames...)
		select {
		case m := <-s.Messages():
			return detach(m)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no message within %v", waitLimit)
	return Message{}
}
