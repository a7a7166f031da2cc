package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/events/transport"
	"github.com/prefixd/prefixd/testutil/zmqpub"
)

// BenchmarkEndToEnd sends recording a's messages, looped with seqs renumbered
// so every pod's keep rising, over a real loopback socket from a ZMTP
// publisher written in Go (libzmq's python binding cannot send fast enough
// to load this path), into a Subscriber, the Pipeline and the indexer: one
// op is one message received, decoded, checked and applied. It reports the
// blocks of BlockStored and BlockRemoved events applied per second.
func BenchmarkEndToEnd(b *testing.B) {
	msgs := readMessages(b, recordingA(b), srcA)
	perPod := map[string]uint64{}
	blocksPer := 0
	var batch events.Batch
	for _, m := range msgs {
		perPod[podOf(m)] = max(perPod[podOf(m)], seqOf(m))
		if err := events.DecodeFrames(m.Frames, &batch); err != nil {
			b.Fatal(err)
		}
		for _, e := range batch.Events {
			blocksPer += len(e.BlockHashes)
		}
	}
	// The wire bytes of b.N messages, renumbered round by round.
	var wire bytes.Buffer
	seq := make([]byte, 8)
	for i := range b.N {
		m := msgs[i%len(msgs)]
		round := uint64(i / len(msgs))
		binary.BigEndian.PutUint64(seq, seqOf(m)+round*perPod[podOf(m)])
		wire.Write(zmqpub.Message(m.Frames[0], seq, m.Frames[2]))
	}
	start := make(chan struct{})
	ep := zmqpub.Serve(b, func(c net.Conn) {
		if zmqpub.Handshake(c, "PUB") != nil {
			return
		}
		<-start
		if _, err := c.Write(wire.Bytes()); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c)
	})
	o := transport.DefaultOptions()
	o.QueueSize = 1 << 14
	o.Logger = quiet
	s, err := transport.NewSubscriber(o, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Connect(ep); err != nil {
		b.Fatal(err)
	}
	ix := newIndexer(b)
	p := newPipeline(b, ix, nil, Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(context.Background(), s.Messages())
	}()
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	deadline := time.Now().Add(time.Minute)
	for counter(p.m.batches) < float64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("%v of %d batches applied after a minute", counter(p.m.batches), b.N)
		}
		time.Sleep(200 * time.Microsecond)
	}
	elapsed := time.Since(t0)
	b.StopTimer()
	_ = s.Close()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N)*float64(blocksPer)/float64(len(msgs))/elapsed.Seconds(), "blocks/s")
}
