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
// Messages() in receive order per connection:
//
//	s, err := transport.NewSubscriber(transport.DefaultOptions(), transport.NewMetrics(reg))
//	addr, err := s.Bind("tcp://*:5557")
//	err = s.Connect("tcp://10.0.0.7:5557")
//	go s.Run(ctx) // closes s when ctx is done
//	for m := range s.Messages() { ... m.Frames ... }
//
// Receive loops never block on the consumer: a message that finds the
// queue full is dropped, counted in
// prefixd_ingest_dropped_total{reason="queue_full",source}, and the next
// message queued from that connection has Resync set. Messages whose topic
// does not start with Options.Topic are dropped with reason "topic_filter".
//
// Replay (and Subscriber.Replay, which also counts) fetches buffered batches
// from a replay ROUTER and accepts both reply shapes, with and without the
// topic frame, up to the end marker.
//
// # Caveats
//
// zmq4 (github.com/go-zeromq/zmq4) is used for the ZMTP handshake and frame
// decoding only, on connections this package dials or accepts and closes
// itself; its sockets are avoided because their reader goroutines outlive
// Close and their reconnect logic dials the wrong endpoint and gives up
// (see zmtp.go). Every connection's reads go through a guard that buffers
// them (zmq4 alone tops out near 175k msgs/s) and refuses a frame whose
// header announces more than MaxFrameBytes before zmq4 allocates it: zmq4
// panics on a frame announcing 2^50 bytes. Panics zmq4 raises on other
// hostile handshakes become errors. Such a connection is closed and counted
// in prefixd_ingest_connection_errors_total and, for size,
// prefixd_ingest_oversize_frames_total; the other connections carry on.
//
// Only the NULL security mechanism and ZMTP 3.0 framing are spoken, which
// every libzmq 4.x publisher accepts. The subscription is sent as a ZMTP 3.0
// subscription message and also applied locally, since a publisher may
// ignore it. Frames are allocated by zmq4 per frame; the receiver owns
// them.
package transport
