package events

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixd/prefixd/internal/fixture"
)

// BenchmarkDecode decodes a batch of 16 BlockStored events of 8 blocks
// (128 tokens) each into a reused Batch, in both encodings, and in the map
// encoding of a hybrid model whose events also carry group_idx,
// kv_cache_spec_kind, the sliding window, locality and ownership.
func BenchmarkDecode(b *testing.B) {
	for _, form := range []string{"array", "map", "map-hybrid"} {
		b.Run(form, func(b *testing.B) {
			const events = 16
			var p []byte
			if form == "map-hybrid" {
				p = hybridBatch(b, events, 8)
			} else {
				p = benchBatch(b, events, 8, form == "map")
			}
			seq := seqFrame(1)
			var batch Batch
			b.ReportAllocs()
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if err := Decode(testTopic, seq, p, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/events, "ns/event")
		})
	}
}

// BenchmarkDecodeRecordings decodes every message of the shared recordings.
func BenchmarkDecodeRecordings(b *testing.B) {
	sim := fixture.SimDir(b)
	var msgs [][3][]byte
	size, events := 0, 0
	var batch Batch
	for _, name := range fixture.Recordings {
		for _, file := range recordingFiles(b, filepath.Join(sim, name)) {
			ms, _ := readRecording(b, file)
			for _, m := range ms {
				msgs = append(msgs, [3][]byte{m.Topic, m.Seq, m.Payload})
				size += len(m.Payload)
				if err := Decode(m.Topic, m.Seq, m.Payload, &batch); err != nil {
					b.Fatal(err)
				}
				events += len(batch.Events)
			}
		}
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		for _, m := range msgs {
			if err := Decode(m[0], m[1], m[2], &batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(events), "ns/event")
}

// BenchmarkDecodeMsgpackV5 decodes the array form of BenchmarkDecode's
// batch with msgpack/v5's low-level Decoder into the same Batch type, for
// comparison with the hand decoder. It handles only that exact shape.
func BenchmarkDecodeMsgpackV5(b *testing.B) {
	const events = 16
	p := benchBatch(b, events, 8, false)
	var batch Batch
	r := bytes.NewReader(p)
	dec := msgpack.NewDecoder(r)
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		r.Reset(p)
		dec.Reset(r)
		if err := decodeV5(dec, &batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/events, "ns/event")
}

func decodeV5(d *msgpack.Decoder, b *Batch) error {
	b.reset()
	if _, err := d.DecodeArrayLen(); err != nil {
		return err
	}
	var err error
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return err
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	for range n {
		e := b.next()
		fields, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		tag, err := d.DecodeString()
		if err != nil {
			return err
		}
		if tag != "BlockStored" || fields != 9 {
			return fmt.Errorf("unexpected event %s of %d fields", tag, fields)
		}
		e.Kind = KindBlockStored
		nh, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for range nh {
			h, err := d.DecodeUint64()
			if err != nil {
				return err
			}
			e.BlockHashes = append(e.BlockHashes, h)
		}
		if e.ParentHash, err = d.DecodeUint64(); err != nil {
			return err
		}
		e.HasParent = e.ParentHash != 0
		nt, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for range nt {
			t, err := d.DecodeUint32()
			if err != nil {
				return err
			}
			e.TokenIDs = append(e.TokenIDs, t)
		}
		if e.BlockSize, err = d.DecodeInt(); err != nil {
			return err
		}
		for range 4 { // lora_id, medium, lora_name, extra_keys
			if err := d.Skip(); err != nil {
				return err
			}
		}
	}
	rank, err := d.DecodeInt()
	b.DPRank, b.HasDPRank = rank, true
	return err
}
