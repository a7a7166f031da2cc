package codec

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
)

func randomQuery(rng *rand.Rand) *prefixdv1.MatchRequest {
	m := &prefixdv1.MatchRequest{Model: "sim-model"}
	if rng.IntN(2) == 0 {
		m.Lora, m.CacheSalt = "adapter-é", "salt"
	}
	switch rng.IntN(4) {
	case 0:
		for range rng.IntN(300) {
			m.TokenIds = append(m.TokenIds, rng.Uint32())
		}
	case 1:
		for range rng.IntN(300) {
			m.BlockHashes = append(m.BlockHashes, rng.Uint64())
		}
	case 2:
		m.Prompt = "Hello, world! ✓"
	case 3:
		m.Messages = []*prefixdv1.ChatMessage{
			{Role: "system", Content: "be brief"},
			{Role: "user", Parts: []*prefixdv1.ContentPart{{Type: "text", Text: "hi"}}},
		}
	}
	for range rng.IntN(3) {
		m.Pods = append(m.Pods, "10.0.0.1:8000")
	}
	return m
}

// check decodes b with DecodeQuery into a message left dirty by an earlier
// decode, and compares it with proto.Unmarshal's (unknown fields aside).
func check(t *testing.T, b []byte, dirty *prefixdv1.MatchRequest) {
	t.Helper()
	want := new(prefixdv1.MatchRequest)
	wantErr := proto.Unmarshal(b, want)
	err := DecodeQuery(b, QueryOf(dirty))
	if wantErr != nil {
		return // malformed: DecodeQuery may reject it or not, but must not panic
	}
	if err != nil {
		t.Fatalf("DecodeQuery: %v; proto.Unmarshal accepted %x", err, b)
	}
	want.ProtoReflect().SetUnknown(nil)
	if !proto.Equal(want, dirty) {
		t.Fatalf("DecodeQuery gave %v, proto.Unmarshal %v", dirty, want)
	}
}

func TestDecodeQueryEqualsUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dirty := &prefixdv1.MatchRequest{Model: "old", TokenIds: make([]uint32, 5, 1000), BlockHashes: make([]uint64, 7, 1000), Pods: []string{"x"}, Prompt: "old"}
	for range 500 {
		b, err := proto.Marshal(randomQuery(rng))
		if err != nil {
			t.Fatal(err)
		}
		// Unknown fields, and unpacked repeated scalars, both legal.
		b = protowire.AppendTag(b, 99, protowire.VarintType)
		b = protowire.AppendVarint(b, 12345)
		if rng.IntN(2) == 0 {
			b = protowire.AppendTag(b, fieldTokenIDs, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, 77)
			b = protowire.AppendTag(b, fieldBlockHashes, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, 1<<63)
		}
		check(t, b, dirty)
	}
	// The capacity is reused.
	hs := make([]uint64, 0, 64)
	dirty.BlockHashes = hs
	b, _ := proto.Marshal(&prefixdv1.MatchRequest{Model: "m", BlockHashes: []uint64{1, 2, 3}})
	if err := DecodeQuery(b, QueryOf(dirty)); err != nil {
		t.Fatal(err)
	}
	if &dirty.BlockHashes[0] != &hs[:1][0] {
		t.Error("block hashes not decoded into the given slice")
	}
}

func TestDecodeQueryRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated packed": {0x2a, 0x10, 1, 2, 3},
		"odd packed":       {0x2a, 0x03, 1, 2, 3},
		"bad utf-8":        {0x0a, 0x02, 0xff, 0xfe},
		"bad tag":          {0x80},
	} {
		if err := DecodeQuery(b, QueryOf(new(prefixdv1.MatchRequest))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	var c Codec
	for _, in := range []proto.Message{
		&prefixdv1.MatchRequest{Model: "m", TokenIds: make([]uint32, 20000)},
		&prefixdv1.ScoreRequest{Model: "m", BlockHashes: []uint64{1, 2}},
		&prefixdv1.MatchResponse{Model: "m", Pods: []*prefixdv1.PodMatch{{Pod: "p", Blocks: 3}}},
	} {
		data, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		out := in.ProtoReflect().New().Interface()
		// Split in two buffers, as gRPC's transport may hand them.
		whole := data.Materialize()
		data.Free()
		half := len(whole) / 2
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(whole[:half]), mem.SliceBuffer(whole[half:])}, out); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(in, out) {
			t.Errorf("%T: round trip gave %v", in, out)
		}
	}
	if _, err := c.Marshal(42); err == nil {
		t.Error("marshalled an int")
	}
}

func FuzzDecodeQuery(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		b, _ := proto.Marshal(randomQuery(rng))
		f.Add(b)
	}
	f.Add([]byte{0x2a, 0x10, 1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		check(t, b, &prefixdv1.MatchRequest{TokenIds: make([]uint32, 0, 8)})
	})
}

// BenchmarkDecodeQuery decodes a query of 8192 token ids and one of 512
// block hashes into a reused message.
func BenchmarkDecodeQuery(b *testing.B) {
	for _, bc := range []struct {
		name string
		m    *prefixdv1.MatchRequest
	}{
		{"tokens-8k", &prefixdv1.MatchRequest{Model: "sim-model", TokenIds: make([]uint32, 8192)}},
		{"hashes-512", &prefixdv1.MatchRequest{Model: "sim-model", BlockHashes: make([]uint64, 512)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data, err := proto.Marshal(bc.m)
			if err != nil {
				b.Fatal(err)
			}
			var into prefixdv1.MatchRequest
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeQuery(data, QueryOf(&into)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
