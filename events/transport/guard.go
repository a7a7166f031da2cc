package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// ZMTP 3.x framing, as the guard reads it.
const (
	greetingLen = 64

	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = ^byte(flagMore | flagLong | flagCommand)

	// minReadBuffer holds the longest frame header (9 bytes); bufio's own
	// minimum is 16.
	minReadBuffer = 16

	// maxUncountedCommand is the largest command frame not counted in the
	// memory budget: one in the short form.
	maxUncountedCommand = 255
)

// guardConn is the net.Conn zmq4 reads from. It buffers reads, and it
// parses the ZMTP stream as it passes: after the 64-byte greeting every
// frame starts with a flags byte and a 1- or 8-byte big-endian size. A
// header is checked whole before its first byte reaches zmq4, because
// zmq4 allocates the announced size at once (a frame announcing 2^50 bytes
// panics in makeslice; one announcing 2^40 exhausts memory). The first
// violation is sticky: every later Read returns it.
//
// The check is also where memory is accounted: each frame's announced size
// is reserved in the Subscriber's budget before zmq4 sees the header
// (short commands excepted: see maxUncountedCommand). When the budget
// cannot take a message frame, the guard reads the frame past itself and
// hands zmq4 the header of an empty frame in its place, and so for the
// rest of the message; the owner learns from take that the message it got
// is such a stand-in. Nothing waits for memory, so a connection holding
// half a message never keeps the others from going on.
//
// A message is timed from its first byte: whenever the guard has to wait
// on the network before the message is complete, it sets a read deadline
// MessageTimeout after the first such wait (once per message), and clears
// it when the message ends. A message that arrives within one buffered read
// costs no deadline at all; the wait for the next message is not timed.
//
// Buffering matters for speed too: zmq4 reads each frame in two or three
// small io.ReadFull calls, one syscall each without a buffer.
//
// A guardConn belongs to one goroutine: it is not safe for concurrent use.
type guardConn struct {
	net.Conn
	br        *bufio.Reader
	mem       *budget
	maxFrame  uint64
	maxMsg    uint64
	maxFrames int
	timeout   time.Duration // MessageTimeout; 0 until arm, during the handshake

	greeted bool    // the greeting has been passed on (or is being)
	left    uint64  // bytes of the current unit (greeting, frame, stand-in header) not yet passed on
	last    bool    // the current unit ends its message
	faking  bool    // the current unit is a stand-in header from fake
	fake    [2]byte // the stand-in header of a dropped frame: same MORE flag, size 0
	skip    uint64  // bytes of a dropped frame not yet read past

	inMsg    bool   // a message has begun (its first header is in) and not ended
	frames   int    // message frames so far in the current message
	msgBytes uint64 // bytes announced by the current message's frames so far
	held     int64  // bytes reserved in mem for frames passed on, until take
	dropped  bool   // the current message is being read past for lack of memory
	deadline bool   // a read deadline is set for the current message

	err error // sticky refusal
}

func newGuardConn(c net.Conn, o Options, mem *budget) *guardConn {
	g := &guardConn{
		Conn:      c,
		mem:       mem,
		maxFrame:  uint64(o.MaxFrameBytes),
		maxMsg:    uint64(o.maxMessageBytes()),
		maxFrames: o.MaxFrames,
	}
	g.br = bufio.NewReaderSize(netReader{g}, o.ReadBufferSize)
	return g
}

// arm starts timing messages (and writes); the handshake is timed by its
// own deadline, which arm leaves to the caller to clear.
func (g *guardConn) arm(messageTimeout time.Duration) { g.timeout = messageTimeout }

// take hands the owner what the guard reserved for the message zmq4 has
// just returned, which the owner then releases or passes on: the bytes of
// its frames, and whether it was dropped for lack of memory (its frames
// are then empty stand-ins and nothing stays reserved). The owner calls it
// after every message and command zmq4 returns, the handshake's READY
// included.
func (g *guardConn) take() (reserved int64, dropped bool) {
	reserved, dropped = g.held, g.dropped
	g.held, g.dropped = 0, false
	return reserved, dropped
}

// release gives back what is reserved for a message not taken, such as
// one cut short by the connection's end.
func (g *guardConn) release() {
	g.mem.release(g.held)
	g.held = 0
}

// Read passes on at most the rest of the current greeting or frame, and
// checks the next frame's header before passing on any of it.
func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if g.left == 0 {
		if err := g.next(); err != nil {
			return 0, err
		}
	}
	if uint64(len(p)) > g.left {
		p = p[:g.left]
	}
	var (
		n   int
		err error
	)
	if g.faking {
		n = copy(p, g.fake[len(g.fake)-int(g.left):])
	} else {
		n, err = g.br.Read(p)
	}
	g.left -= uint64(n)
	if g.left == 0 {
		g.faking = false
		if g.last {
			g.endMessage()
		}
	}
	return n, err
}

// Write writes p, within MessageTimeout once armed: a peer that sends
// PINGs and reads no PONG cannot hold the connection's goroutine.
func (g *guardConn) Write(p []byte) (int, error) {
	if g.timeout > 0 {
		if err := g.Conn.SetWriteDeadline(time.Now().Add(g.timeout)); err != nil {
			return 0, err
		}
	}
	return g.Conn.Write(p)
}

// next sets left to the length of the next unit of the stream: the
// greeting, a frame's header and body once the header is known good, or
// the stand-in header of a frame read past. An error from the network
// leaves the state as it was, so that a Read after it resumes.
func (g *guardConn) next() error {
	if g.skip > 0 {
		return g.discard()
	}
	if !g.greeted {
		g.greeted = true
		g.left, g.last = greetingLen, false
		return nil
	}
	h, err := g.br.Peek(2) // between messages, the wait for the first byte is not timed (see netReader)
	if err != nil {
		return err // a read error, not a refusal: not sticky, zmq4 sees it as is
	}
	if !g.inMsg {
		g.inMsg, g.frames, g.msgBytes, g.dropped = true, 0, 0, false
	}
	flags := h[0]
	if flags&flagReserved != 0 {
		return g.refuse(fmt.Errorf("frame flags %#02x have reserved bits set: %w", flags, ErrProtocol))
	}
	size, hdr := uint64(h[1]), uint64(2)
	if flags&flagLong != 0 {
		if h, err = g.br.Peek(9); err != nil {
			return err
		}
		size, hdr = binary.BigEndian.Uint64(h[1:9]), 9
	}
	if size > g.maxFrame {
		return g.refuse(fmt.Errorf("frame announces %d bytes; the limit is %d: %w", size, g.maxFrame, ErrFrameTooLarge))
	}
	command := flags&flagCommand != 0
	if command {
		if flags&flagMore != 0 || g.frames != 0 {
			return g.refuse(fmt.Errorf("command frame inside a multipart message: %w", ErrProtocol))
		}
		g.last = true
	} else {
		g.frames++
		if g.frames > g.maxFrames {
			return g.refuse(fmt.Errorf("message has more than %d frames: %w", g.maxFrames, ErrProtocol))
		}
		g.msgBytes += size // no overflow: msgBytes <= maxMsg <= 2^62 before, size < 2^63
		if g.msgBytes > g.maxMsg {
			return g.refuse(fmt.Errorf("message announces %d bytes in %d frames; the limit is %d: %w", g.msgBytes, g.frames, g.maxMsg, ErrMessageTooLarge))
		}
		g.last = flags&flagMore == 0
	}
	// A short command (READY, PING) is consumed as soon as it is read, one
	// at a time: not counting it keeps a full budget from failing every
	// handshake.
	counted := size > 0 && (!command || size > maxUncountedCommand)
	if counted && !g.dropped {
		switch {
		case g.mem.reserve(int64(size)):
			g.held += int64(size)
		case command:
			// A stand-in would be an empty command, which zmq4 refuses.
			return g.refuse(fmt.Errorf("a %d-byte command does not fit in the memory budget of %d bytes: %w", size, g.mem.limit, ErrMemory))
		default:
			// Drop the message: what it holds goes back at once.
			g.mem.release(g.held)
			g.held, g.dropped = 0, true
		}
	}
	if g.dropped {
		g.fake = [2]byte{flags & flagMore, 0}
		g.skip = hdr + size
		return g.discard()
	}
	g.left = hdr + size
	return nil
}

// discard reads past the rest of a dropped frame, then makes its stand-in
// header the current unit.
func (g *guardConn) discard() error {
	for g.skip > 0 {
		n, err := g.br.Discard(int(min(g.skip, 1<<30)))
		g.skip -= uint64(n)
		if err != nil {
			return err
		}
	}
	g.faking, g.left = true, uint64(len(g.fake))
	return nil
}

// endMessage notes that the current message has been passed on whole.
func (g *guardConn) endMessage() {
	g.inMsg = false
	if g.deadline {
		g.deadline = false
		_ = g.Conn.SetReadDeadline(time.Time{})
	}
}

func (g *guardConn) refuse(err error) error {
	g.err = err
	return err
}

// netReader is what the guard's buffer reads from: the connection, under a
// read deadline while a message is unfinished (once armed).
type netReader struct{ g *guardConn }

func (r netReader) Read(p []byte) (int, error) {
	g := r.g
	// A message is unfinished once it has begun, or once a byte of it is
	// buffered: the buffer is asked from inside its own fill, which has
	// moved what it holds to the front and reads after it.
	if g.timeout > 0 && !g.deadline && (g.inMsg || g.br.Buffered() > 0) {
		if err := g.Conn.SetReadDeadline(time.Now().Add(g.timeout)); err != nil {
			return 0, err
		}
		g.deadline = true
	}
	n, err := g.Conn.Read(p)
	if err != nil && g.deadline && errors.Is(err, os.ErrDeadlineExceeded) {
		err = g.refuse(fmt.Errorf("message unfinished %v after it began: %w", g.timeout, ErrSlowMessage))
	}
	return n, err
}
