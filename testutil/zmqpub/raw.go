package zmqpub

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Hand-made ZMTP 3.0 bytes, for peers that misbehave on purpose: a frame
// header announcing 2^50 bytes, a READY with a broken property, garbage.

// Greeting returns a ZMTP 3.0 greeting for the NULL mechanism.
func Greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// FrameHeader returns the header of a frame announcing size bytes, in the
// long form when size > 255; flags are ORed in (1 more, 4 command).
func FrameHeader(size uint64, flags byte) []byte {
	if size > 255 {
		h := make([]byte, 9)
		h[0] = flags | 0x02
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	return []byte{flags, byte(size)}
}

// Frame returns one message frame; more marks a frame that is not the
// message's last.
func Frame(body []byte, more bool) []byte {
	var flags byte
	if more {
		flags = 1
	}
	return append(FrameHeader(uint64(len(body)), flags), body...)
}

// Message returns the frames of one message, encoded.
func Message(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		b = append(b, Frame(f, i < len(frames)-1)...)
	}
	return b
}

// Command returns a command frame.
func Command(name string, body []byte) []byte {
	c := append([]byte{byte(len(name))}, name...)
	c = append(c, body...)
	return append(FrameHeader(uint64(len(c)), 0x04), c...)
}

// Ready returns a READY command that announces socketType.
func Ready(socketType string) []byte {
	return Command("READY", Property("Socket-Type", socketType))
}

// Property encodes one ZMTP metadata property.
func Property(name, value string) []byte {
	p := append([]byte{byte(len(name))}, name...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(value)))
	return append(p, value...)
}

// Handshake sends a greeting and READY(socketType) on c, then reads the
// peer's greeting and its first command. Anything can be written on c
// afterwards.
func Handshake(c net.Conn, socketType string) error {
	return HandshakeWith(c, Ready(socketType))
}

// HandshakeWith is Handshake with a READY of the caller's making.
func HandshakeWith(c net.Conn, ready []byte) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(append(Greeting(), ready...)); err != nil {
		return fmt.Errorf("zmqpub: writing greeting: %w", err)
	}
	var g [64]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return fmt.Errorf("zmqpub: reading greeting: %w", err)
	}
	var h [9]byte
	if _, err := io.ReadFull(c, h[:2]); err != nil {
		return fmt.Errorf("zmqpub: reading command header: %w", err)
	}
	size := uint64(h[1])
	if h[0]&0x02 != 0 {
		if _, err := io.ReadFull(c, h[2:9]); err != nil {
			return fmt.Errorf("zmqpub: reading command header: %w", err)
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if h[0]&0x04 == 0 || size > 1<<16 {
		return fmt.Errorf("zmqpub: want a READY command; have flags %#x, %d bytes", h[0], size)
	}
	if _, err := io.CopyN(io.Discard, c, int64(size)); err != nil {
		return fmt.Errorf("zmqpub: reading command: %w", err)
	}
	return nil
}

// Dial connects to a tcp:// endpoint. The connection is closed when the
// test ends.
func Dial(tb testing.TB, endpoint string) net.Conn {
	tb.Helper()
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		tb.Fatalf("zmqpub: %q is not a tcp:// endpoint", endpoint)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatalf("zmqpub: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// DialFrom connects to a tcp:// endpoint from a local source address such
// as 127.0.0.2 (every 127.0.0.0/8 address is the loopback on Linux), as a
// peer on another host would. The connection is closed when the test ends.
func DialFrom(tb testing.TB, endpoint, source string) net.Conn {
	tb.Helper()
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		tb.Fatalf("zmqpub: %q is not a tcp:// endpoint", endpoint)
	}
	ip := net.ParseIP(source)
	if ip == nil {
		tb.Fatalf("zmqpub: %q is not an IP address", source)
	}
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: ip}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("zmqpub: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Serve listens on a loopback port and runs handle, in a goroutine of its
// own, on every connection accepted, and returns the tcp:// endpoint. When
// the test ends the listener and the connections are closed and the
// goroutines waited for.
func Serve(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("zmqpub: %v", err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // protects conns
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "tcp://" + l.Addr().String()
}
