package transport

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
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
)

// guardConn is the net.Conn zmq4 reads from. It buffers reads, and it
// parses the ZMTP stream as it passes: after the 64-byte greeting every
// frame starts with a flags byte and a 1- or 8-byte big-endian size. A
// header is checked whole before its first byte reaches zmq4, because
// zmq4 allocates the announced size at once (a frame announcing 2^50 bytes
// panics in makeslice; one announcing 2^40 exhausts memory). The first
// violation is sticky: every later Read returns it.
//
// Buffering matters for speed too: zmq4 reads each frame in two or three
// small io.ReadFull calls, one syscall each without a buffer.
type guardConn struct {
	net.Conn
	br        *bufio.Reader
	maxFrame  uint64
	maxFrames int

	greeted bool   // the greeting has been passed on (or is being)
	left    uint64 // bytes of the current greeting or frame not yet passed on
	frames  int    // message frames so far in the current message
	err     error  // sticky refusal
}

func newGuardConn(c net.Conn, bufSize int, maxFrame int64, maxFrames int) *guardConn {
	return &guardConn{
		Conn:      c,
		br:        bufio.NewReaderSize(c, bufSize),
		maxFrame:  uint64(maxFrame),
		maxFrames: maxFrames,
	}
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
	n, err := g.br.Read(p)
	g.left -= uint64(n)
	return n, err
}

// next sets left to the length of the next unit of the stream: the
// greeting, or a frame's header and body once the header is known good.
func (g *guardConn) next() error {
	if !g.greeted {
		g.greeted = true
		g.left = greetingLen
		return nil
	}
	h, err := g.br.Peek(2)
	if err != nil {
		return err // a read error, not a refusal: not sticky, zmq4 sees it as is
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
	if flags&flagCommand != 0 {
		if flags&flagMore != 0 || g.frames != 0 {
			return g.refuse(fmt.Errorf("command frame inside a multipart message: %w", ErrProtocol))
		}
	} else {
		g.frames++
		if g.frames > g.maxFrames {
			return g.refuse(fmt.Errorf("message has more than %d frames: %w", g.maxFrames, ErrProtocol))
		}
		if flags&flagMore == 0 {
			g.frames = 0
		}
	}
	g.left = hdr + size
	return nil
}

func (g *guardConn) refuse(err error) error {
	g.err = err
	return err
}
