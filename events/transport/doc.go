// Package transport moves the raw frames of KV cache events from ZeroMQ
// publishers (vLLM, llm-d-inference-sim) into one bounded queue, and asks
// publishers' replay endpoints for batches that were missed. It knows
// nothing of msgpack or sequence numbers: it delivers frames.
//
// # Basics
//
// A Subscriber is a ZeroMQ SUB in both topologies at once. Bind listens for
// publishers that connect (the sim always connects; vLLM connects when its
// endpoint names a host); Connect dials a publisher that binds (vLLM with
// tcp://*:port), one connection and one goroutine per endpoint, re-dialled
// with exponential backoff and jitter after any error. Messages arrive on
// Messages() in receive order per connection, and the receiver releases
// each once it is done with its frames:
//
//	s, err := transport.NewSubscriber(transport.DefaultOptions(), transport.NewMetrics(reg))
//	addr, err := s.Bind("tcp://*:5557")
//	err = s.Connect("tcp://10.0.0.7:5557")
//	go s.Run(ctx) // closes s when ctx is done
//	for m := range s.Messages() { ... m.Frames ...; m.Release() }
//
// Receive loops never block on the consumer: a message that finds the
// queue full is dropped, counted in
// prefixd_ingest_dropped_total{reason="queue_full",source}, and the next
// message queued from that connection has Resync set. Messages whose topic
// does not start with Options.Topic are dropped with reason "topic_filter".
// Message.Inbound tells the messages of publishers that connected to a
// bound address, which anyone who reaches the port can be, from those of
// endpoints the Subscriber dialled.
//
// Replay (and Subscriber.Replay, which also counts) fetches buffered batches
// from a replay ROUTER and accepts both reply shapes, with and without the
// topic frame, up to the end marker.
//
// # Limits
//
// A bound address listens on whatever interface it names, with no
// credentials, so every resource a peer can make the Subscriber hold is
// bounded:
//
//   - Memory: the frames of messages being received, on every connection,
//     and of messages queued until their receiver calls Message.Release
//     share one budget, Options.MaxBufferedBytes (256 MiB). A frame is
//     counted when its header arrives, before it is allocated. A message
//     frame that does not fit is read past without being stored, and its
//     message dropped with reason "memory" and the next one flagged Resync,
//     as for a full queue; the connection stays up, and nothing ever waits
//     for memory. A receiver that does not release its messages therefore
//     ends up with every new one dropped.
//   - Size: a frame over MaxFrameBytes (16 MiB), or a message whose frames
//     announce more than MaxFrameBytes + 64 KiB together, closes its
//     connection before the frame is allocated (reason "oversize").
//   - Time: a connection must finish its ZMTP handshake within
//     HandshakeTimeout (10 s) of opening, whether or not it sends anything
//     (reason "handshake"), and every message within MessageTimeout (10 s)
//     of its first byte (reason "slow_message"). An idle connection,
//     between messages, is not timed.
//   - Connections: a bound address takes at most MaxPeers (1024)
//     publishers, and at most MaxConnsPerHost (128) connections from one
//     source IP address; more are closed at once (reasons "too_many" and
//     "too_many_from_host") and logged at most one line per 10 seconds per
//     reason.
//
// Connections in their handshake are counted in prefixd_ingest_handshakes,
// those past it in prefixd_ingest_connections, both by source; every
// connection that ends, other than by Close, is counted in
// prefixd_ingest_connection_errors_total by reason. Options.AddFlags
// registers the limits as --zmq-* flags.
//
// A panic in a connection's goroutine or in a replay is recovered by
// Options.Recovery (counted in prefixd_panics_total and logged with its
// stack) and ends that connection or replay alone (reason "panic").
//
// # Caveats
//
// zmq4 (github.com/go-zeromq/zmq4) is used for the ZMTP handshake and frame
// decoding only, on connections this package dials or accepts and closes
// itself; its sockets are avoided because their reader goroutines outlive
// Close and their reconnect logic dials the wrong endpoint and gives up
// (see zmtp.go). Every connection's reads go through a guard that buffers
// them (zmq4 alone tops out near 175k msgs/s), checks every frame header
// before zmq4 allocates what it announces (zmq4 panics on a frame
// announcing 2^50 bytes), accounts frames in the memory budget and times
// messages. Panics zmq4 raises on other hostile handshakes become errors.
// Such a connection is closed and counted in
// prefixd_ingest_connection_errors_total and, for size,
// prefixd_ingest_oversize_frames_total; the other connections carry on.
//
// Short commands (up to 255 bytes: READY, PING) are not counted in the
// budget, so that a full budget does not fail every handshake; each
// connection reads one at a time and drops it at once. Each connection
// also has a read buffer (ReadBufferSize, 64 KiB) outside the budget.
//
// Only the NULL security mechanism and ZMTP 3.0 framing are spoken, which
// every libzmq 4.x publisher accepts. The subscription is sent as a ZMTP 3.0
// subscription message and also applied locally, since a publisher may
// ignore it. Frames are allocated by zmq4 per frame; the receiver owns
// them until it releases the message.
package transport
