package blockhash

import (
	"bytes"
	"hash/fnv"
	"math/rand/v2"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// These tests check the hand-written CBOR against fxamacker/cbor with
// CanonicalEncOptions, the encoder llm-d-kv-cache's token processor uses,
// on random blocks.

// mmHash has the shape of llm-d-kv-cache's kvblock.MMHash.
type mmHash struct {
	Hash   string
	Offset int64
}

func canonical(t *testing.T) cbor.EncMode {
	t.Helper()
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	return em
}

func fnv64a(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// randTokens returns n ids spread over every head width.
func randTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		switch r.IntN(5) {
		case 0:
			out[i] = uint32(r.IntN(24))
		case 1:
			out[i] = uint32(r.IntN(256))
		case 2:
			out[i] = uint32(r.IntN(65536))
		default:
			out[i] = r.Uint32()
		}
	}
	return out
}

func randParent(r *rand.Rand) uint64 {
	return r.Uint64() >> (r.IntN(8) * 8)
}

func TestLLMDMatchesFxamacker(t *testing.T) {
	em := canonical(t)
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		parent := randParent(r)
		tokens := randTokens(r, r.IntN(40))
		enc, err := em.Marshal([]any{parent, tokens, nil})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := llmdBlock(parent, tokens), fnv64a(enc); got != want {
			t.Fatalf("block %d %v: %d, want %d", parent, tokens, got, want)
		}
		var mm []BlockMM
		var ref []mmHash
		for range 1 + r.IntN(3) {
			id := string(rune('a'+r.IntN(26))) + "_" + string(make([]byte, r.IntN(30)))
			off := r.IntN(600) - 300
			mm = append(mm, BlockMM{ID: id, Offset: off})
			ref = append(ref, mmHash{Hash: id, Offset: int64(off)})
		}
		enc, err = em.Marshal([]any{parent, tokens, ref})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := llmdBlockMM(parent, tokens, mm), fnv64a(enc); got != want {
			t.Fatalf("block with %v: %d, want %d", mm, got, want)
		}
	}
	// The root: hash(FNV-64a(seed), nil []uint32, model).
	h, err := New(Config{Scheme: LLMD, Seed: "seed", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	var noTokens []uint32
	enc, err := em.Marshal([]any{fnv64a([]byte("seed")), noTokens, "some-model"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := h.Root("some-model", "", ""); got != fnv64a(enc) {
		t.Errorf("root %d, want %d", got, fnv64a(enc))
	}
}

func TestVLLMEncodingMatchesFxamacker(t *testing.T) {
	em := canonical(t)
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		// A 32-byte (sha256_cbor) or 16-byte (xxhash_cbor) parent.
		raw := make([]byte, 32-16*r.IntN(2))
		for i := range raw {
			raw[i] = byte(r.Uint32())
		}
		parent, err := ParseDigest(raw)
		if err != nil {
			t.Fatal(err)
		}
		tokens := randTokens(r, 1+r.IntN(40))
		p := Prompt{}
		if r.IntN(2) == 0 {
			p.LoRA = "lora-" + string(rune('a'+r.IntN(26)))
		}
		if r.IntN(2) == 0 {
			p.CacheSalt = "salt"
		}
		start := r.IntN(3) * len(tokens)
		var items []MMItem
		var extra []any
		if p.LoRA != "" {
			extra = append(extra, p.LoRA)
		}
		for range r.IntN(3) {
			it := MMItem{ID: "mm" + string(rune('a'+r.IntN(26))), Offset: start + r.IntN(2*len(tokens)) - len(tokens), Length: 1}
			items = append(items, it)
			extra = append(extra, []any{it.ID, it.Offset - start})
		}
		if start == 0 && p.CacheSalt != "" {
			extra = append(extra, p.CacheSalt)
		}
		var want []byte
		if len(extra) == 0 {
			want, err = em.Marshal([]any{raw, tokens, nil})
		} else {
			want, err = em.Marshal([]any{raw, tokens, extra})
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := vllmEncode(nil, &parent, tokens, &p, items, start); !bytes.Equal(got, want) {
			t.Fatalf("encoding %x, want %x", got, want)
		}
	}
}
