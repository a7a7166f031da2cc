package transport

import (
	"fmt"
	"net"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// zmq4 is used below its socket layer: zmq4.Open runs the ZMTP handshake
// over a net.Conn this package dialled or accepted, and Conn.RecvMsg reads
// messages in the caller's goroutine. zmq4's sockets are not used because
// their goroutines cannot be owned: qreader.listen sends every message on a
// 10-slot channel without watching the socket's context, so once the
// application stops calling Recv (as it does when closing) that goroutine
// blocks forever; Dial's retries sleep without watching the context; and its
// auto-reconnect re-dials the socket's last endpoint (not the lost one) from
// inside the reader, gives up after ten tries, and is never triggered by
// io.ErrUnexpectedEOF. Here each connection has one goroutine, and closing
// the net.Conn ends it.

// openZMTP performs the ZMTP 3.0 handshake (NULL security) on c. zmq4 can
// panic on hostile handshakes (a READY whose metadata is cut short, an
// unknown Socket-Type); such a panic becomes an ErrProtocol error.
func openZMTP(c net.Conn, typ zmq4.SocketType, server bool) (zc *zmq4.Conn, err error) {
	defer func() {
		if r := recover(); r != nil {
			zc, err = nil, fmt.Errorf("zmq4 panicked in the handshake (%v): %w", r, ErrProtocol)
		}
	}()
	return zmq4.Open(c, null.Security(), typ, nil, server, nil)
}

// recvMsg reads the next message. Its frames are freshly allocated by zmq4
// and belong to the caller. A zmq4 panic becomes an ErrProtocol error.
func recvMsg(zc *zmq4.Conn) (msg zmq4.Msg, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = zmq4.Msg{}, fmt.Errorf("zmq4 panicked reading a message (%v): %w", r, ErrProtocol)
		}
	}()
	return zc.RecvMsg()
}

// subscribe sends a ZMTP 3.0 subscription (a message whose first byte is 1,
// followed by the topic prefix), which libzmq publishers accept from 3.0
// peers.
func subscribe(zc *zmq4.Conn, topic string) error {
	sub := make([]byte, 1+len(topic))
	sub[0] = 1
	copy(sub[1:], topic)
	return zc.SendMsg(zmq4.NewMsg(sub))
}
