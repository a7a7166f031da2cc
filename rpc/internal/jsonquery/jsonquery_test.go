package jsonquery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"

	"github.com/prefixd/prefixd/rpc/internal/querylimit"
)

// matchRequestJSON is rpc.MatchRequestJSON, which this package may not
// import: what encoding/json decodes a body into.
type matchRequestJSON struct {
	Model       string             `json:"model"`
	LoRA        string             `json:"lora,omitempty"`
	CacheSalt   string             `json:"cache_salt,omitempty"`
	TokenIDs    []uint32           `json:"token_ids,omitempty"`
	BlockHashes []uint64           `json:"block_hashes,omitempty"`
	Prompt      string             `json:"prompt,omitempty"`
	Messages    []tokenize.Message `json:"messages,omitempty"`
	Pods        []string           `json:"pods,omitempty"`
}

// decodeStd decodes body as the handler did before Decode: encoding/json
// with DisallowUnknownFields, and nothing but whitespace after the value.
func decodeStd(body []byte) (matchRequestJSON, error) {
	var r matchRequestJSON
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, err
	}
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return r, errors.New("data after the value")
	}
	return r, nil
}

var wide = querylimit.Limits{MaxTokens: 1 << 30, MaxBlockHashes: 1 << 30}

// check decodes body with Decode and with encoding/json and compares.
func check(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := decodeStd(body)
	var got indexer.Query
	err := Decode(body, &got, wide, nil)
	if err != nil {
		var se *SyntaxError
		if wantErr == nil && errors.As(err, &se) && strings.Contains(se.Msg, "nested more than") {
			return // deeper than Decode skips; encoding/json allows 10000
		}
		if wantErr == nil {
			t.Fatalf("Decode(%q): %v; encoding/json accepts it: %+v", body, err, want)
		}
		return
	}
	if wantErr != nil {
		t.Fatalf("Decode(%q) accepts it as %+v; encoding/json: %v", body, got, wantErr)
	}
	if got.Model != want.Model || got.LoRA != want.LoRA || got.CacheSalt != want.CacheSalt || got.Prompt != want.Prompt ||
		!slices.Equal(got.TokenIDs, want.TokenIDs) || !slices.Equal(got.BlockHashes, want.BlockHashes) || !slices.Equal(got.Pods, want.Pods) {
		t.Fatalf("Decode(%q) = %+v; encoding/json %+v", body, got, want)
	}
	if len(got.Messages) != len(want.Messages) {
		t.Fatalf("Decode(%q): %d messages; encoding/json %d", body, len(got.Messages), len(want.Messages))
	}
	for i, m := range got.Messages {
		w := want.Messages[i]
		if m.Role != w.Role || m.Content.Parts != nil {
			t.Fatalf("Decode(%q): message %d = %+v; encoding/json %+v", body, i, m, w)
		}
		// Parts are joined: compare what the indexer renders.
		if g, w := tokenize.AppendFlat(nil, got.Messages[i:i+1]), tokenize.AppendFlat(nil, want.Messages[i:i+1]); !bytes.Equal(g, w) {
			t.Fatalf("Decode(%q): message %d renders %q; encoding/json's %q", body, i, g, w)
		}
	}
}

func TestDecodeEqualsEncodingJSON(t *testing.T) {
	for _, body := range testBodies {
		check(t, []byte(body))
	}
}

// testBodies are edge cases of the request, of JSON and of encoding/json.
var testBodies = []string{
	``, ` `, `null`, ` null `, `{}`, `[]`, `"x"`, `1`, `{"model":"m"}`, `{"model":"m"} `, `{"model":"m"} {}`, `{"model":"m"}}`, `{"model":"m"}]`,
	`{"model":"m","token_ids":[1,2,4294967295]}`, `{"model":"m","token_ids":[4294967296]}`, `{"token_ids":[-1]}`, `{"token_ids":[1.0]}`,
	`{"token_ids":[1e2]}`, `{"token_ids":[01]}`, `{"token_ids":[0]}`, `{"token_ids":["1"]}`, `{"token_ids":[1,]}`, `{"token_ids":[,1]}`,
	`{"token_ids":[]}`, `{"token_ids":null}`, `{"token_ids":[null,3]}`, `{"token_ids":1}`, `{"token_ids":[1 2]}`, `{"token_ids":[[1]]}`,
	`{"block_hashes":[0,18446744073709551615]}`, `{"block_hashes":[18446744073709551616]}`, `{"block_hashes":[99999999999999999999]}`,
	`{"token_ids":[1,2,3],"token_ids":[null,null,null,null]}`, `{"token_ids":[1,2,3],"token_ids":[9],"token_ids":[null,null,null,null,null]}`,
	`{"pods":["a","b"],"pods":[null,"c",null]}`, `{"pods":["a,b",""]}`, `{"pods":[1]}`, `{"pods":null}`,
	`{"Model":"m","LORA":"l","Cache_Salt":"s","PROMPT":"p"}`, `{"mod\u0065l":"m"}`, `{"model":"a","model":"b"}`, `{"model":"a","model":null}`,
	`{"model":5}`, `{"model":true}`, `{"tokens":[1]}`, `{"model":"m",}`, `{"model" "m"}`, `{model:"m"}`, `{"model":"m"`, `{"model":"m`,
	`{"prompt":"a\"b\\c\/d\be\ff\ng\rh\ti"}`, `{"prompt":"\u00e9\u20AC\ud83d\ude00"}`, `{"prompt":"\ud83d"}`, `{"prompt":"\ud83dx"}`,
	`{"prompt":"\ud83d\u0041"}`, `{"prompt":"\ude00\ud83d"}`, `{"prompt":"\u12"}`, `{"prompt":"\x"}`, `{"prompt":"\'"}`,
	"{\"prompt\":\"a\x01b\"}", "{\"prompt\":\"\xff\xfe\"}", "{\"prompt\":\"é\xc3\"}", "{\"prompt\":\"\xed\xa0\x80\"}", `{"prompt":"a\`,
	`{"messages":[]}`, `{"messages":null}`, `{"messages":[null]}`, `{"messages":[{}]}`, `{"messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":null}]}`, `{"messages":[{"role":"user","content":5}]}`, `{"messages":[{"role":"u","content":{}}]}`,
	`{"messages":[{"role":"u","name":"x"}]}`, `{"messages":[{"Role":"u","CONTENT":"x"}]}`, `{"messages":[1]}`, `{"messages":{}}`,
	`{"messages":[{"role":"u","content":[]}]}`, `{"messages":[{"role":"u","content":[null]}]}`, `{"messages":[{"content":[{}]}]}`,
	`{"messages":[{"content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x","d":[1,-2.5e3,true,null]}},{"type":"text"}]}]}`,
	`{"messages":[{"content":[{"type":"te\u0078t","text":"a\nb"},{"TYPE":"text","Text":"c"},{"type":"text","text":"d","text":"e"}]}]}`,
	`{"messages":[{"content":[{"type":"text","text":"a","type":null}]}]}`, `{"messages":[{"content":[{"type":5}]}]}`,
	`{"messages":[{"content":[{"type":"text","text":5}]}]}`, `{"messages":[{"content":["text"]}]}`, `{"messages":[{"content":[{"x":[}]}]}`,
	`{"messages":[{"content":[{"x":01}]}]}`, `{"messages":[{"content":[{"x":-}]}]}`, `{"messages":[{"content":[{"x":1.}]}]}`,
	`{"messages":[{"content":[{"x":tru}]}]}`, `{"messages":[{"content":[{"x":1e+}]}]}`, `{"messages":[{"content":[{"x":-0.5E-7}]}]}`,
	`{"messages":[{"role":"a","content":"x"}],"messages":[{}]}`, `{"messages":[{"role":"a","content":[{"type":"text","text":"q"}]}],"messages":[{"role":"b"}]}`,
	`{"messages":[{"content":[{"type":"text","text":"a"}` + strings.Repeat(`,{"x":`, 50) + `1` + strings.Repeat(`}`, 50) + `]}]}`,
	"\t{\n\"model\" :\r\"m\" , \"token_ids\" : [ 1 , 2 ] }\n",
}

func TestDecodeLimits(t *testing.T) {
	lim := querylimit.Limits{MaxTokens: 8, MaxBlockHashes: 2}
	ids := func(n int) string { return strings.TrimSuffix(strings.Repeat("7,", n), ",") }
	msgs := func(n int) string { return strings.TrimSuffix(strings.Repeat(`{"role":"u","content":"x"},`, n), ",") }
	for _, tc := range []struct {
		body  string
		field string // "" for no error
	}{
		{`{"token_ids":[` + ids(8) + `]}`, ""},
		{`{"token_ids":[` + ids(9) + `]}`, "token_ids"},
		{`{"token_ids":[` + ids(1<<16) + `]}`, "token_ids"},
		{`{"block_hashes":[1,2]}`, ""},
		{`{"block_hashes":[1,2,3]}`, "block_hashes"},
		{`{"messages":[` + msgs(2) + `]}`, ""},
		{`{"messages":[` + msgs(3) + `]}`, "messages"},
		// Over the limit before the syntax error: the limit is reported.
		{`{"token_ids":[` + ids(9) + `,x]}`, "token_ids"},
	} {
		var q indexer.Query
		err := Decode([]byte(tc.body), &q, lim, nil)
		var le *querylimit.Error
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%.60s: %v", tc.body, err)
		case tc.field != "" && (!errors.As(err, &le) || le.Field != tc.field):
			t.Errorf("%.60s: %v, want a limit error on %s", tc.body, err, tc.field)
		case tc.field == "token_ids" && cap(q.TokenIDs) > lim.MaxTokens:
			t.Errorf("%.60s: decoded %d token ids, more than the limit", tc.body, cap(q.TokenIDs))
		}
	}
	var le *querylimit.Error
	err := Decode([]byte(`{"messages":[`+msgs(3)+`]}`), new(indexer.Query), lim, nil)
	if !errors.As(err, &le) || le.Error() != "more than 8 tokens: more than 2 messages, each at least 4 tokens" {
		t.Errorf("messages over the limit: %v", err)
	}
}

// TestDecodeReserves checks that what Decode allocates is what it
// reserves, within a few allocations' overhead, for bodies of each kind,
// and that a refusal from reserve ends the decode.
func TestDecodeReserves(t *testing.T) {
	lim := querylimit.Limits{MaxTokens: 1 << 17, MaxBlockHashes: 8192}
	const size = 1 << 20
	bodies := hostileBodies(size)
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			var q indexer.Query
			reserved := 0
			reserve := func(n int) error { reserved += n; return nil }
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := Decode(body, &q, lim, reserve)
			runtime.ReadMemStats(&after)
			var le *querylimit.Error
			if err != nil && !errors.As(err, &le) {
				t.Fatal(err)
			}
			allocated := int(after.TotalAlloc - before.TotalAlloc)
			// Reserved bytes are rounded up to size classes, and the
			// decoder's own small allocations (closures, names) are not
			// reserved: allow an eighth and 16 KiB more.
			if allocated > reserved+reserved/8+16<<10 {
				t.Errorf("allocated %d bytes, reserved %d", allocated, reserved)
			}
			// Most bodies decode to at most their size; invalid UTF-8
			// triples (U+FFFD for each byte, as encoding/json), an empty
			// pod name is a 16-byte string header for 3 bytes, and the
			// messages slice (at most MaxTokens/4 messages of 56 bytes)
			// doubles as it fills: what matters is that the reservation
			// says so.
			factor := map[string]int{"invalid utf-8": 3, "pods": 6, "messages": 8}[name]
			if reserved > max(factor, 2)*len(body) {
				t.Errorf("reserved %d bytes for a body of %d", reserved, len(body))
			}
			t.Logf("body %d bytes: reserved %d, allocated %d, %v", len(body), reserved, allocated, err)

			refused := errors.New("refused")
			left := reserved / 2
			err = Decode(body, &q, lim, func(n int) error {
				if n > left {
					return refused
				}
				left -= n
				return nil
			})
			if reserved > 0 && !errors.Is(err, refused) {
				t.Errorf("with half the bytes it needs: %v", err)
			}
		})
	}
}

// hostileBodies returns bodies of about size bytes that each stress one
// part of the decoder.
func hostileBodies(size int) map[string][]byte {
	rep := func(prefix, elem, suffix string) []byte {
		var b bytes.Buffer
		b.WriteString(prefix)
		for b.Len() < size {
			b.WriteString(elem)
		}
		b.WriteString(suffix)
		return b.Bytes()
	}
	return map[string][]byte{
		"token ids":     rep(`{"model":"m","token_ids":[0`, `,1`, `]}`),
		"block hashes":  rep(`{"model":"m","block_hashes":[0`, `,1`, `]}`),
		"prompt":        rep(`{"model":"m","prompt":"`, `word `, `"}`),
		"escapes":       rep(`{"model":"m","prompt":"`, `\u00e9\n`, `"}`),
		"invalid utf-8": rep(`{"model":"m","prompt":"`, "\xff", `"}`),
		"messages":      rep(`{"model":"m","messages":[{}`, `,{}`, `]}`),
		"message text":  rep(`{"model":"m","messages":[{"role":"user","content":"`, `hello `, `"}]}`),
		"empty parts":   rep(`{"model":"m","messages":[{"role":"u","content":[{}`, `,{}`, `]}]}`),
		"text parts":    rep(`{"model":"m","messages":[{"role":"u","content":[{"type":"text"}`, `,{"type":"text"}`, `]}]}`),
		"pods":          rep(`{"model":"m","token_ids":[1],"pods":[""`, `,""`, `]}`),
		"nested parts":  rep(`{"model":"m","messages":[{"content":[{"x":[[[[[[[[1]]]]]]]]}`, `,{"x":[[[[[[[[1]]]]]]]]}`, `]}]}`),
	}
}

// FuzzDecodeEqualsEncodingJSON checks Decode against encoding/json on
// match request bodies, seeded from the recorded chats.
func FuzzDecodeEqualsEncodingJSON(f *testing.F) {
	for _, b := range testBodies {
		f.Add([]byte(b))
	}
	for i, r := range fixture.Requests(f, "") {
		if i%25 != 0 {
			continue
		}
		var chat struct {
			Model    string          `json:"model"`
			Messages json.RawMessage `json:"messages"`
		}
		if json.Unmarshal(r.Body, &chat) != nil {
			continue
		}
		f.Add(fmt.Appendf(nil, `{"model":%q,"messages":%s}`, chat.Model, chat.Messages))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check(t, body)
	})
}

// BenchmarkDecode decodes a query of 8192 token ids and a chat.
func BenchmarkDecode(b *testing.B) {
	ids := make([]uint32, 8192)
	for i := range ids {
		ids[i] = uint32(i) * 2654435761
	}
	tokens, _ := json.Marshal(map[string]any{"model": "m", "token_ids": ids})
	chat, _ := json.Marshal(map[string]any{"model": "m", "messages": []tokenize.Message{
		{Role: "system", Content: tokenize.TextContent(strings.Repeat("You are a careful assistant. ", 40))},
		{Role: "user", Content: tokenize.TextContent("How long is the Rhine?")},
	}})
	for _, bc := range []struct {
		name string
		body []byte
	}{{"tokens-8k", tokens}, {"chat", chat}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			var q indexer.Query
			for b.Loop() {
				if err := Decode(bc.body, &q, querylimit.Limits{MaxTokens: 1 << 17, MaxBlockHashes: 8192}, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"-encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeStd(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
