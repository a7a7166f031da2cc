package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

type replayed struct {
	seq            uint64
	topic, payload []byte
}

func collect(out *[]replayed) ReplayFunc {
	return func(seq uint64, topic, payload []byte) error {
		*out = append(*out, replayed{seq, topic, payload})
		return nil
	}
}

// Replay against a real libzmq ROUTER, in both reply shapes, reproduces the
// recorded replay of the sim byte for byte.
func TestReplayBothShapes(t *testing.T) {
	recorded := recording(t, fixture.Path(t, "a_array_random_seedless", "replay-sim-1-from-0.jsonl"))
	p := zmqpub.Start(t)
	p.Bind("tcp://127.0.0.1:0")
	p.Skip(3, 4) // withheld from the live stream, still replayed
	p.SendFile(fixture.Path(t, "a_array_random_seedless", "replay-sim-1-from-0.jsonl"))
	withTopic := p.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
	noTopic := p.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeNoTopic)

	for _, tc := range []struct {
		name, ep string
		start    uint64
		topic    bool
	}{
		{"topic from 0", withTopic, 0, true},
		{"topic from 5", withTopic, 5, true},
		{"no topic from 0", noTopic, 0, false},
		{"no topic from 5", noTopic, 5, false},
		{"beyond the buffer", withTopic, 1000, true},
	} {
		var got []replayed
		ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
		err := Replay(ctx, tc.ep, tc.start, collect(&got))
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var want []replayed
		for _, f := range recorded { // ["", topic, seq, payload], end marker last
			seq := binary.BigEndian.Uint64(f[2])
			if seq == EndSeq || seq < tc.start {
				continue
			}
			r := replayed{seq, f[1], f[3]}
			if !tc.topic {
				r.topic = nil
			}
			want = append(want, r)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d batches; want %d", tc.name, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.seq != w.seq || string(g.topic) != string(w.topic) || string(g.payload) != string(w.payload) || (g.topic == nil) != (w.topic == nil) {
				t.Fatalf("%s: batch %d: seq %d topic %q (%d payload bytes); want seq %d topic %q (%d)", tc.name, i, g.seq, g.topic, len(g.payload), w.seq, w.topic, len(w.payload))
			}
		}
	}
}

func TestReplayErrors(t *testing.T) {
	p := zmqpub.Start(t)
	p.Bind("tcp://127.0.0.1:0")
	p.Send(msg(1)...)
	p.Send(msg(2)...)
	ctx := t.Context()

	t.Run("malformed replies", func(t *testing.T) {
		for _, shape := range []string{zmqpub.ShapeShortSeq, zmqpub.ShapeNoDelim} {
			ep := p.ReplayBind("tcp://127.0.0.1:0", shape)
			var got []replayed
			if err := Replay(ctx, ep, 0, collect(&got)); !errors.Is(err, ErrReplyShape) {
				t.Errorf("%s: err %v; want ErrReplyShape", shape, err)
			}
		}
	})
	t.Run("no end marker", func(t *testing.T) {
		ep := p.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeNoEnd)
		var got []replayed
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err := Replay(ctx, ep, 0, collect(&got))
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrReplayIncomplete) || len(got) != 2 {
			t.Fatalf("err %v after %d batches; want DeadlineExceeded and ErrReplayIncomplete after 2", err, len(got))
		}
	})
	t.Run("callback error stops the replay", func(t *testing.T) {
		ep := p.ReplayBind("tcp://127.0.0.1:0", zmqpub.ShapeTopic)
		stop := errors.New("enough")
		n := 0
		err := Replay(ctx, ep, 0, func(uint64, []byte, []byte) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("err %v after %d calls; want %v after 1", err, n, stop)
		}
	})
	t.Run("nothing listening", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ep := "tcp://" + l.Addr().String()
		_ = l.Close()
		if err := Replay(ctx, ep, 0, collect(new([]replayed))); err == nil {
			t.Fatal("replay from a closed port succeeded")
		}
	})
	t.Run("bad endpoint", func(t *testing.T) {
		if err := Replay(ctx, "tcp://*:5601", 0, collect(new([]replayed))); !errors.Is(err, ErrEndpoint) {
			t.Fatalf("err %v; want ErrEndpoint", err)
		}
	})
	t.Run("oversize frame is counted", func(t *testing.T) {
		ep := zmqpub.Serve(t, func(c net.Conn) {
			if zmqpub.Handshake(c, "ROUTER") == nil {
				_, _ = c.Write(hugeFrame)
				_, _ = io.Copy(io.Discard, c)
			}
		})
		s, reg := newSub(t, nil)
		if err := s.Replay(ctx, ep, 0, collect(new([]replayed))); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("err %v; want ErrFrameTooLarge", err)
		}
		if v := counter(t, reg, "prefixd_ingest_oversize_frames_total", map[string]string{"source": ep}); v != 1 {
			t.Fatalf("oversize_frames_total = %v; want 1", v)
		}
		if v := counter(t, reg, "prefixd_ingest_replay_requests_total", map[string]string{"source": ep, "result": "error"}); v != 1 {
			t.Fatalf("replay_requests_total{error} = %v; want 1", v)
		}
	})
}

func TestParseReply(t *testing.T) {
	seq := seqFrame(7)
	end := seqFrame(EndSeq)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		ok     bool
		seq    uint64
		topic  string
	}{
		{"with topic", [][]byte{{}, []byte("kv@a@m"), seq, []byte("p")}, true, 7, "kv@a@m"},
		{"without topic", [][]byte{{}, seq, []byte("p")}, true, 7, ""},
		{"end with topic", [][]byte{{}, {}, end, {}}, true, EndSeq, ""},
		{"end without topic", [][]byte{{}, end, {}}, true, EndSeq, ""},
		{"end with payload", [][]byte{{}, end, []byte("x")}, false, 0, ""},
		{"no frames", nil, false, 0, ""},
		{"no delimiter", [][]byte{[]byte("kv@a@m"), seq, []byte("p")}, false, 0, ""},
		{"two frames", [][]byte{{}, seq}, false, 0, ""},
		{"five frames", [][]byte{{}, {}, {}, seq, {}}, false, 0, ""},
		{"short seq", [][]byte{{}, []byte("kv@"), seq[:4], {}}, false, 0, ""},
	} {
		s, topic, _, err := parseReply(tc.frames)
		if tc.ok != (err == nil) || s != tc.seq || string(topic) != tc.topic {
			t.Errorf("%s: seq %d topic %q err %v", tc.name, s, topic, err)
		}
		if err != nil && !errors.Is(err, ErrReplyShape) {
			t.Errorf("%s: %v is not ErrReplyShape", tc.name, err)
		}
	}
}
