package ingest

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/prefixd/prefixd/events/transport"
)

// BenchmarkPipeline feeds recording a's messages through Run again and
// again, renumbered so that every pod's seq keeps increasing: one op is one
// message decoded, checked and applied (blocks already held are re-added,
// removals of blocks gone are counted). The feeder's seq frame copies are
// part of the allocations.
func BenchmarkPipeline(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			msgs := readMessages(b, recordingA(b), srcA)
			// Each pod's seqs run 1..n in the recording; round r renumbers
			// them r*n+1..r*n+n.
			last := make([]uint64, len(msgs))
			perPod := make(map[string]uint64)
			for _, m := range msgs {
				perPod[podOf(m)] = max(perPod[podOf(m)], seqOf(m))
			}
			for i, m := range msgs {
				last[i] = perPod[podOf(m)]
			}
			ix := newIndexer(b)
			p := newPipeline(b, ix, nil, Options{Workers: workers})
			in := make(chan transport.Message, 1024)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = p.Run(context.Background(), in)
			}()
			size := 0
			for _, m := range msgs {
				size += len(m.Frames[2])
			}
			b.SetBytes(int64(size / len(msgs)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				m := msgs[i%len(msgs)]
				round := uint64(i / len(msgs))
				seq := make([]byte, 8)
				binary.BigEndian.PutUint64(seq, seqOf(m)+round*last[i%len(msgs)])
				in <- transport.Message{Source: m.Source, Peer: m.Peer, Frames: [][]byte{m.Frames[0], seq, m.Frames[2]}}
			}
			close(in)
			<-done
			b.StopTimer()
			if n := counter(p.m.batches); n != float64(b.N) {
				b.Fatalf("%v batches applied, want %d", n, b.N)
			}
			if n := counter(p.m.resets.WithLabelValues("127.0.0.1:8001")) + counter(p.m.gaps.WithLabelValues("127.0.0.1:8001")); n != 0 {
				b.Fatalf("%v resets and gaps", n)
			}
		})
	}
}
