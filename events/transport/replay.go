package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"
)

// EndSeq is the seq of the end marker that closes a replay reply.
const EndSeq = ^uint64(0)

// DefaultReplayTimeout bounds a Replay whose context has no deadline.
const DefaultReplayTimeout = 30 * time.Second

// ReplayFunc receives one replayed batch in order. topic is nil when the
// publisher sends no topic frame (vLLM <= 0.25). The slices belong to the
// function. An error from it stops the replay and is returned wrapped.
type ReplayFunc func(seq uint64, topic, payload []byte) error

// Replay asks a publisher's replay endpoint (a ROUTER: the sim's
// --kv-events-replay-endpoint, vLLM's replay_endpoint) for every batch it
// still buffers with seq >= start, and calls fn for each. It connects a
// DEALER, sends ["", start as 8 bytes big-endian], and reads replies of
// either shape, ["", topic, seq, payload] or ["", seq, payload], until the
// end marker (seq EndSeq, empty payload). The context bounds the whole
// exchange; without a deadline DefaultReplayTimeout applies. Limits are
// those of DefaultOptions, with a memory budget of its own;
// Subscriber.Replay uses the Subscriber's limits and budget, and counts.
// A reply counts in the budget until fn returns; one that does not fit
// ends the replay with ErrMemory. A panic, in the exchange or in fn, ends
// the replay with an error wrapping recovery.ErrPanic.
func Replay(ctx context.Context, endpoint string, start uint64, fn ReplayFunc) error {
	o := DefaultOptions()
	return replay(ctx, o, nil, &budget{limit: o.MaxBufferedBytes}, endpoint, start, fn)
}

func replay(ctx context.Context, opts Options, m *Metrics, mem *budget, endpoint string, start uint64, fn ReplayFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("replay from %s: %w", endpoint, opts.Recovery.Error(r, "zmq_replay"))
		}
	}()
	network, addr, err := splitEndpoint(endpoint, false)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultReplayTimeout)
		defer cancel()
	}
	d := net.Dialer{Timeout: opts.DialTimeout}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("replay from %s: %w", endpoint, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	g := newGuardConn(nc, opts, mem)
	var held int64 // taken from g for the reply being handled
	defer func() {
		stop()
		_ = nc.Close()
		g.release()
		mem.release(held)
	}()
	// fail reports err, or the context's error when the context ended the
	// connection.
	fail := func(format string, a ...any) error {
		err := fmt.Errorf(format, a...)
		if (errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrMessageTooLarge)) && m != nil {
			m.oversize.WithLabelValues(endpoint).Inc()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return err
	}

	zc, err := openZMTP(g, zmq4.Dealer, false)
	ready, _ := g.take()
	mem.release(ready)
	if err != nil {
		return fail("replay from %s: %w", endpoint, err)
	}
	g.arm(opts.MessageTimeout)
	var seqFrame [8]byte
	binary.BigEndian.PutUint64(seqFrame[:], start)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqFrame[:])); err != nil {
		return fail("replay from %s: sending the request: %w", endpoint, err)
	}

	n := 0
	for {
		msg, err := recvMsg(zc)
		if err != nil {
			return fail("replay from %s from seq %d: %w after %d batches: %w", endpoint, start, ErrReplayIncomplete, n, err)
		}
		var dropped bool
		if held, dropped = g.take(); dropped {
			return fail("replay from %s, reply %d: the reply does not fit in the memory budget of %d bytes: %w", endpoint, n+1, mem.limit, ErrMemory)
		}
		if msg.Type == zmq4.CmdMsg {
			mem.release(held)
			held = 0
			continue
		}
		seq, topic, payload, err := parseReply(msg.Frames)
		if err != nil {
			return fail("replay from %s, reply %d: %w", endpoint, n+1, err)
		}
		if seq == EndSeq {
			return nil
		}
		if err := fn(seq, topic, payload); err != nil {
			return fmt.Errorf("replay from %s: seq %d: %w", endpoint, seq, err)
		}
		mem.release(held) // the slices are fn's now, out of the budget's sight
		held = 0
		n++
	}
}

// parseReply splits one replay reply. A reply with seq EndSeq is the end
// marker and must have an empty payload.
func parseReply(frames [][]byte) (seq uint64, topic, payload []byte, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		first := -1
		if len(frames) > 0 {
			first = len(frames[0])
		}
		return 0, nil, nil, fmt.Errorf("want an empty first frame; have %d frames, the first of %d bytes: %w", len(frames), first, ErrReplyShape)
	}
	var seqf []byte
	switch len(frames) {
	case 4:
		topic, seqf, payload = frames[1], frames[2], frames[3]
	case 3:
		seqf, payload = frames[1], frames[2]
	default:
		return 0, nil, nil, fmt.Errorf("want 3 or 4 frames; have %d: %w", len(frames), ErrReplyShape)
	}
	if len(seqf) != 8 {
		return 0, nil, nil, fmt.Errorf("want an 8-byte seq frame; have %d bytes: %w", len(seqf), ErrReplyShape)
	}
	seq = binary.BigEndian.Uint64(seqf)
	if seq == EndSeq && len(payload) != 0 {
		return 0, nil, nil, fmt.Errorf("end marker carries a %d-byte payload: %w", len(payload), ErrReplyShape)
	}
	return seq, topic, payload, nil
}
