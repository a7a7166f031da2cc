package blockhash

import (
	"bytes"
	"encoding/hex"
	"slices"
	"testing"
)

// The vectors below were computed with Debian's Python 3 hashlib, cbor2
// 5.4.6 and xxhash 3.2.0 by testdata/gen_vectors.py, which restates vLLM's
// hash_block_tokens, generate_block_hash_extra_keys, init_none_hash,
// sha256_cbor and xxhash_cbor and llm-d-kv-cache's token processor. The
// sha256_cbor NONE_HASH values for seeds "", "0" and "42" and the chains
// "plain", "mixed widths", "lora" and "salt" are also in
// github.com/vMaroon/llm-d-kv-cache
// pkg/kvcache/kvblock/testdata/vllm_block_hashes.json, generated there with
// cbor2 independently: both sources agree. pycheck_test.go recomputes chains
// like these with the same Python libraries on every run.

func mustHex(t *testing.T, s string) Digest {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad digest %q: %v", s, err)
	}
	d, err := ParseDigest(b)
	if err != nil {
		t.Fatalf("bad digest %q: %v", s, err)
	}
	return d
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestVLLMNoneHash(t *testing.T) {
	for seed, bySchemes := range map[string]map[Scheme]string{
		"": {
			VLLMSHA256CBOR: "8d33f520a3c4cef80d2453aef81b612bfe1cb44c8b2025630ad38662763f13d3",
			VLLMXXHashCBOR: "902bbcf97174df1ea0a482954fa7b32a",
		},
		"0": {
			VLLMSHA256CBOR: "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
			VLLMXXHashCBOR: "1ebe36576dcb573f26b99533a20aaeca",
		},
		"42": {
			VLLMSHA256CBOR: "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780",
			VLLMXXHashCBOR: "a9d2e63407fce1a26c9dc9d7fa2d7caf",
		},
		VLLMDefaultSeed: {
			VLLMSHA256CBOR: "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
			VLLMXXHashCBOR: "a4e364baa0791a6f63bbf917db9b700d",
		},
	} {
		for s, want := range bySchemes {
			h := mustNew(t, s, seed, 16)
			if got := h.NoneHash(); got != mustHex(t, want) {
				t.Errorf("%v: NONE_HASH(%q) = %v, want %s", s, seed, got, want)
			}
		}
	}
}

func TestVLLMChainVectors(t *testing.T) {
	mixed := slices.Concat(seq(0, 16), []uint32{200, 256, 257, 65535, 65536, 100000}, seq(1, 10),
		[]uint32{1234567, 999999, 50000, 60000, 70000, 80000, 90000}, seq(12, 9))
	var high []uint32
	for i := range 50 {
		high = append(high, 0xffffffff-uint32(i))
	}
	type chain struct {
		digests []string
		keys    []uint64
	}
	cases := []struct {
		name   string
		seed   string
		tokens []uint32
		prompt Prompt
		want   map[Scheme]chain
	}{
		{"plain", "0", seq(1, 16), Prompt{}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{"202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea"},
				[]uint64{3236607068019569386}},
			VLLMXXHashCBOR: {[]string{"c2d7a75070fc6d6b0c3fb0af456c1009"},
				[]uint64{882618318818381833}},
		}},
		{"mixed widths", "0", mixed, Prompt{}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{
				"d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
				"800c6db6f4e8d28a50c5728e07d6d58bc4a1e3dfc0d2be6f720f2701292fd515",
				"dd6ac866e4ddefbb478b452e1482d98cc80075c6a917550db1eccbe00a17b912",
			}, []uint64{12687895063098490012, 8218830730913895701, 12820846402319399186}},
			VLLMXXHashCBOR: {[]string{
				"209f5d549fc07c8e39d823615ede61ce",
				"03bf297dc08bea36724fbef0c504ea44",
				"16011612ebfc0cad2d5366c99a3eb3df",
			}, []uint64{4168120356241826254, 8237012184790788676, 3266067170836001759}},
		}},
		// sha256_cbor's default seed; xxhash_cbor has none (DefaultSeed).
		{"default seed", VLLMDefaultSeed, seq(1, 32), Prompt{}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{
				"cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682",
				"2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf",
			}, []uint64{8866452693264111234, 807986237951177663}},
			VLLMXXHashCBOR: {[]string{
				"94bdea02d195af01562671ef4f8c323f",
				"79ad30f69b8905006056599c47ff5499",
			}, []uint64{6207774409022517823, 6941834403395884185}},
		}},
		{"lora", "0", seq(1, 32), Prompt{Model: "m", LoRA: "my-lora"}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{
				"07df9ef1b6800860b8c8d385e23a8a5b0eba8e3b5390de25d657793dd7c611fd",
				"e7ac5f1857e4b45c77b98c91765ba91d9be68cdb7ea2ae585b3129c227bf6f96",
			}, []uint64{15444946753610453501, 6571079245177515926}},
			VLLMXXHashCBOR: {[]string{
				"0d30446cf3addb29c80c096f1fcb7536",
				"b6e82df084426d86f9945cc9c28d5f57",
			}, []uint64{14414906880185562422, 17984101233619459927}},
		}},
		{"salt", "0", seq(1, 32), Prompt{CacheSalt: "salt-xyz"}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{
				"38d6ec5b48c7cce7025e2b7cfc39b16e19738d197e39075f02528859e5b01608",
				"dc89025b17f88d89f00dd3fa088312a793ef8c97bf7f3ab74061d1d1a8d70e10",
			}, []uint64{167346055853118984, 4639219789579357712}},
			VLLMXXHashCBOR: {[]string{
				"4399d2adb1f69c5db48240cfe66dc5e4",
				"bca57de8bc06d9c581fac333d43025e2",
			}, []uint64{13007029935467775460, 9366013002441041378}},
		}},
		// extra_keys: block 0 ("adapter-1", ("img-a", 3), "tenant-7"),
		// block 1 ("adapter-1", ("img-a", -13)), block 2 ("adapter-1",
		// ("img-b", 8)); two trailing tokens form no block.
		{"all extras", "42", high, Prompt{LoRA: "adapter-1", CacheSalt: "tenant-7",
			MM: []MMItem{{ID: "img-a", Offset: 3, Length: 20}, {ID: "img-b", Offset: 40, Length: 2}}}, map[Scheme]chain{
			VLLMSHA256CBOR: {[]string{
				"ed6caae9378e67cfc9c2522d5d6bf182bd23e7df8d5f7986b0be3858813952e0",
				"68e4e90c556470d85efe1424d02fd140b6ed337e5bebdd66f6d1996e0c5b0007",
				"6f1d08f367b4bbbf40f692a030efb89dc5930cd689432def6e7428c8f7b3c283",
			}, []uint64{12735678749026636512, 17785165101395542023, 7959031285084832387}},
			VLLMXXHashCBOR: {[]string{
				"5ce5ffa68089f93153ffe24f0be32c24",
				"10b0ac29d76c3173a1220a2b44c422d0",
				"57e601cf87013946d46fb7c067adbac7",
			}, []uint64{6052805253338967076, 11610853970268136144, 15307655695456647879}},
		}},
	}
	for _, c := range cases {
		for _, s := range []Scheme{VLLMSHA256CBOR, VLLMXXHashCBOR} {
			t.Run(s.String()+"/"+c.name, func(t *testing.T) {
				want := c.want[s]
				h := mustNew(t, s, c.seed, 16)
				keys, err := h.AppendPrompt(nil, c.tokens, c.prompt)
				if err != nil || !slices.Equal(keys, want.keys) {
					t.Fatalf("AppendPrompt = %v, %v; want %v", keys, err, want.keys)
				}
				ds, err := h.AppendDigests(nil, h.NoneHash(), c.tokens, c.prompt, 0)
				if err != nil || len(ds) != len(want.digests) {
					t.Fatalf("AppendDigests = %d digests, %v; want %d", len(ds), err, len(want.digests))
				}
				for i, d := range want.digests {
					if ds[i] != mustHex(t, d) || ds[i].Key() != want.keys[i] {
						t.Errorf("block %d: digest %v key %d, want %s %d", i, ds[i], ds[i].Key(), d, want.keys[i])
					}
				}
				// Carrying the full digest from block 1 on gives the same tail.
				if len(ds) > 1 {
					tail, err := h.AppendDigests(nil, ds[0], c.tokens[16:], c.prompt, 16)
					if err != nil || !slices.Equal(tail, ds[1:]) {
						t.Errorf("chain from digest 0 = %v, %v; want %v", tail, err, ds[1:])
					}
				}
			})
		}
	}
}

// simTokens are 32 token ids: the first block of every recorded chat, then
// ids at each CBOR head width boundary.
var simTokens = []uint32{638357778, 638357778, 399020470, 1226705564, 2382766391, 902835988, 3692005271,
	2938279028, 1294387552, 2966577424, 2530666425, 847405050, 4082650640, 2878048650, 1543540969,
	2513735939, 7, 300, 70000, 5, 24, 23, 255, 256, 65535, 65536, 0, 1, 2, 3, 4, 4294967295}

func TestLLMDVectors(t *testing.T) {
	cases := []struct {
		seed   string
		prompt Prompt
		root   uint64
		keys   []uint64
	}{
		// The first key is the first block hash of the first BlockStored of
		// a_array_random_seedless, recorded from the sim.
		{"", Prompt{Model: "sim-model"}, 13232839209400720724, []uint64{9294734529213721759, 18109457971987129815}},
		{"42", Prompt{Model: "sim-model"}, 11976370798384822355, []uint64{11823393086416433971, 12393278480948854667}},
		// The adapter's name roots the chain; the cache salt is not hashed.
		{"", Prompt{Model: "sim-model", LoRA: "my-lora", CacheSalt: "ignored"}, 16311450238565543944,
			[]uint64{17225931673134815322, 12954402425548139572}},
		// Block 0: [{"Hash": "sim_img_0_1f", "Offset": 5}]; block 1:
		// [{"Hash": "sim_img_0_1f", "Offset": -11}, {"Hash": "x", "Offset": 15}].
		{"", Prompt{Model: "sim-model", MM: []MMItem{{ID: "sim_img_0_1f", Offset: 5, Length: 20}, {ID: "x", Offset: 31, Length: 1}}},
			13232839209400720724, []uint64{7609265892258326182, 17305248087693217989}},
	}
	for _, c := range cases {
		h, err := New(Config{Scheme: LLMD, Seed: c.seed, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		root, err := h.Root(c.prompt.Model, c.prompt.LoRA, c.prompt.CacheSalt)
		if err != nil || root != c.root {
			t.Errorf("seed %q %+v: root %d, %v; want %d", c.seed, c.prompt, root, err, c.root)
		}
		keys, err := h.AppendPrompt(nil, simTokens, c.prompt)
		if err != nil || !slices.Equal(keys, c.keys) {
			t.Errorf("seed %q %+v: keys %v, %v; want %v", c.seed, c.prompt, keys, err, c.keys)
		}
	}
}

// TestCBORHeads pins the hand-written encoder to RFC 8949 Appendix A.
func TestCBORHeads(t *testing.T) {
	ints := []struct {
		v    int64
		want string
	}{
		{0, "00"}, {1, "01"}, {10, "0a"}, {23, "17"}, {24, "1818"}, {25, "1819"}, {100, "1864"},
		{1000, "1903e8"}, {1000000, "1a000f4240"}, {1000000000000, "1b000000e8d4a51000"},
		{-1, "20"}, {-10, "29"}, {-100, "3863"}, {-1000, "3903e7"},
	}
	for _, c := range ints {
		if got := hex.EncodeToString(appendInt(nil, c.v)); got != c.want {
			t.Errorf("int %d: %s, want %s", c.v, got, c.want)
		}
	}
	if got := hex.EncodeToString(appendHead(nil, majorUint, 18446744073709551615)); got != "1bffffffffffffffff" {
		t.Errorf("max uint64: %s", got)
	}
	for s, want := range map[string]string{"": "60", "a": "6161", "IETF": "6449455446", "\u00fc": "62c3bc"} {
		if got := hex.EncodeToString(appendText(nil, s)); got != want {
			t.Errorf("text %q: %s, want %s", s, got, want)
		}
	}
	// The streaming FNV writers hash exactly the bytes the appenders write.
	for _, v := range []uint64{0, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<64 - 1} {
		for _, major := range []byte{majorUint, majorNeg, majorText, majorArray} {
			if got, want := fnvHead(fnvOffset64, major, v), fnvBytes(appendHead(nil, major, v)); got != want {
				t.Errorf("fnvHead(%#x, %d) = %d, want %d", major, v, got, want)
			}
		}
		if v <= 1<<32-1 {
			if got, want := fnvToken(fnvOffset64, uint32(v)), fnvBytes(appendHead(nil, majorUint, v)); got != want {
				t.Errorf("fnvToken(%d) = %d, want %d", v, got, want)
			}
		}
	}
	// appendTokens writes what appendHead writes for each token.
	var tokens []uint32
	var want []byte
	for _, v := range []uint32{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1} {
		tokens = append(tokens, v)
		want = appendHead(want, majorUint, uint64(v))
	}
	if got := appendTokens([]byte{0x99}, tokens); !bytes.Equal(got[1:], want) || got[0] != 0x99 {
		t.Errorf("appendTokens(%v) = %x, want 99%x", tokens, got, want)
	}
	for _, v := range []int64{-1, -24, -25, -256, -257, 1 << 40, -1 << 40, -1 << 63} {
		if got, want := fnvInt(fnvOffset64, v), fnvBytes(appendInt(nil, v)); got != want {
			t.Errorf("fnvInt(%d) = %d, want %d", v, got, want)
		}
	}
}

func fnvBytes(b []byte) uint64 {
	h := fnvOffset64
	for _, c := range b {
		h = fnvByte(h, c)
	}
	return h
}
