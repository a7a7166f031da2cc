package codec

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"

	"github.com/prefixd/prefixd/rpc/querylimit"
)

func randomQuery(rng *rand.Rand) *prefixdv1.Query {
	m := &prefixdv1.Query{Model: "sim-model"}
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
func check(t *testing.T, b []byte, dirty *prefixdv1.Query) {
	t.Helper()
	want := new(prefixdv1.Query)
	wantErr := proto.Unmarshal(b, want)
	err := DecodeQuery(b, dirty)
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
	// A Target without limits decodes the same, whatever it reserves.
	tg := NewTarget(new(prefixdv1.Query))
	tg.Reserve = func(int) error { return nil }
	tg.decode(b)
	if tg.Err != nil || !proto.Equal(want, tg.Msg) {
		t.Fatalf("Target gave %v, %v; proto.Unmarshal %v", tg.Msg, tg.Err, want)
	}
}

func TestDecodeQueryEqualsUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dirty := &prefixdv1.Query{Model: "old", TokenIds: make([]uint32, 5, 1000), BlockHashes: make([]uint64, 7, 1000), Pods: []string{"x"}, Prompt: "old"}
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
	b, _ := proto.Marshal(&prefixdv1.Query{Model: "m", BlockHashes: []uint64{1, 2, 3}})
	if err := DecodeQuery(b, dirty); err != nil {
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
		if err := DecodeQuery(b, new(prefixdv1.Query)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	var c Codec
	for _, in := range []proto.Message{
		&prefixdv1.Query{Model: "m", TokenIds: make([]uint32, 20000)},
		&prefixdv1.Query{Model: "m", BlockHashes: []uint64{1, 2}},
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
		check(t, b, &prefixdv1.Query{TokenIds: make([]uint32, 0, 8)})
	})
}

// BenchmarkDecodeQuery decodes a query of 8192 token ids and one of 512
// block hashes into a reused message.
func BenchmarkDecodeQuery(b *testing.B) {
	for _, bc := range []struct {
		name string
		m    *prefixdv1.Query
	}{
		{"tokens-8k", &prefixdv1.Query{Model: "sim-model", TokenIds: make([]uint32, 8192)}},
		{"hashes-512", &prefixdv1.Query{Model: "sim-model", BlockHashes: make([]uint64, 512)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data, err := proto.Marshal(bc.m)
			if err != nil {
				b.Fatal(err)
			}
			var into prefixdv1.Query
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeQuery(data, &into); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestTargetLimits(t *testing.T) {
	lim := querylimit.Limits{MaxTokens: 8, MaxBlockHashes: 2}
	msgs := func(n int) []*prefixdv1.ChatMessage {
		out := make([]*prefixdv1.ChatMessage, n)
		for i := range out {
			out[i] = &prefixdv1.ChatMessage{Role: "user", Content: "hi"}
		}
		return out
	}
	unpacked := func(n int) []byte {
		var b []byte
		for range n {
			b = protowire.AppendTag(b, fieldTokenIDs, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, 7)
		}
		return b
	}
	marshal := func(m *prefixdv1.Query) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		b     []byte
		field string // "" for no error
	}{
		{"tokens at the limit", marshal(&prefixdv1.Query{Model: "m", TokenIds: make([]uint32, 8)}), ""},
		{"tokens over", marshal(&prefixdv1.Query{Model: "m", TokenIds: make([]uint32, 9)}), "token_ids"},
		{"a million tokens", marshal(&prefixdv1.Query{Model: "m", TokenIds: make([]uint32, 1<<20)}), "token_ids"},
		{"unpacked tokens over", unpacked(9), "token_ids"},
		{"hashes over", marshal(&prefixdv1.Query{Model: "m", BlockHashes: make([]uint64, 3)}), "block_hashes"},
		{"messages at the limit", marshal(&prefixdv1.Query{Model: "m", Messages: msgs(2)}), ""},
		{"messages over", marshal(&prefixdv1.Query{Model: "m", Messages: msgs(3)}), "messages"},
	} {
		tg := NewTarget(new(prefixdv1.Query))
		tg.Limits = lim
		reserved := 0
		tg.Reserve = func(n int) error { reserved += n; return nil }
		// Through the codec, in two pieces as gRPC may hand them.
		half := len(tc.b) / 2
		if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b[:half]), mem.SliceBuffer(tc.b[half:])}, tg); err != nil {
			t.Fatalf("%s: Unmarshal returned %v: a Target keeps its errors", tc.name, err)
		}
		var le *querylimit.Error
		switch {
		case tc.field == "" && tg.Err != nil:
			t.Errorf("%s: %v", tc.name, tg.Err)
		case tc.field != "" && (!errors.As(tg.Err, &le) || le.Field != tc.field):
			t.Errorf("%s: %v, want a limit error on %s", tc.name, tg.Err, tc.field)
		}
		// The copy of the two pieces, and for a query over the limit
		// nothing of the tokens beyond it.
		if reserved < len(tc.b) || (tc.field == "token_ids" && reserved > len(tc.b)+64) {
			t.Errorf("%s: reserved %d bytes for a message of %d", tc.name, reserved, len(tc.b))
		}
	}
	tg := NewTarget(new(prefixdv1.Query))
	tg.Limits = lim
	tg.decode(marshal(&prefixdv1.Query{Messages: msgs(3)}))
	if tg.Err == nil || tg.Err.Error() != "more than 8 tokens: more than 2 messages, each at least 4 tokens" {
		t.Errorf("messages over the limit: %v", tg.Err)
	}
}

// TestTargetReserves checks that what a Target's decode allocates is what
// it reserves, and that Held is what the request holds, for messages that
// each stress one field, and that a refusal ends the decode.
func TestTargetReserves(t *testing.T) {
	parts := make([]*prefixdv1.ContentPart, 1<<16)
	for i := range parts {
		parts[i] = &prefixdv1.ContentPart{}
	}
	msgs := make([]*prefixdv1.ChatMessage, 1<<14)
	for i := range msgs {
		msgs[i] = &prefixdv1.ChatMessage{}
	}
	for name, m := range map[string]*prefixdv1.Query{
		"tokens":      {Model: "m", TokenIds: make([]uint32, 1<<17)},
		"hashes":      {Model: "m", BlockHashes: make([]uint64, 8192)},
		"prompt":      {Model: "m", Prompt: strings.Repeat("word ", 1<<17)},
		"messages":    {Model: "m", Messages: msgs},
		"empty parts": {Model: "m", Messages: []*prefixdv1.ChatMessage{{Role: "u", Parts: parts}}},
		"pods":        {Model: "m", Pods: make([]string, 1<<16)},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			tg := NewTarget(new(prefixdv1.Query))
			tg.Limits = querylimit.Limits{MaxTokens: 1 << 17, MaxBlockHashes: 8192}
			reserved := 0
			tg.Reserve = func(n int) error { reserved += n; return nil }
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			tg.decode(b)
			runtime.ReadMemStats(&after)
			if tg.Err != nil {
				t.Fatal(tg.Err)
			}
			allocated := int(after.TotalAlloc - before.TotalAlloc)
			if allocated > reserved+reserved/8+16<<10 {
				t.Errorf("allocated %d bytes, reserved %d", allocated, reserved)
			}
			if tg.Held > reserved || tg.Held < allocated/2 {
				t.Errorf("held %d bytes, reserved %d, allocated %d", tg.Held, reserved, allocated)
			}
			t.Logf("message %d bytes: reserved %d, held %d, allocated %d", len(b), reserved, tg.Held, allocated)

			refused := errors.New("refused")
			left := reserved / 2
			tg = NewTarget(new(prefixdv1.Query))
			tg.Reserve = func(n int) error {
				if n > left {
					return refused
				}
				left -= n
				return nil
			}
			tg.decode(b)
			if !errors.Is(tg.Err, refused) {
				t.Errorf("with half the bytes it needs: %v", tg.Err)
			}
		})
	}
}
