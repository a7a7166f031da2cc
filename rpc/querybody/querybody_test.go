package querybody

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/rpc/querylimit"
)

// reference is what encoding/json decodes a body into, as Decode documents
// it: the query's fields, every other field ignored.
type reference struct {
	Model       string             `json:"model"`
	LoRA        string             `json:"lora"`
	CacheSalt   string             `json:"cache_salt"`
	TokenIDs    []uint32           `json:"token_ids"`
	BlockHashes []refHash          `json:"block_hashes"`
	Prompt      refPrompt          `json:"prompt"`
	Messages    []tokenize.Message `json:"messages"`
	Pods        []string           `json:"pods"`
}

// refHash is a block hash: a number, or a string of decimal digits.
type refHash uint64

func (h *refHash) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	s := string(b)
	if b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	*h = refHash(v)
	return err
}

// refPrompt is a prompt: a string, or an array of one string, of token ids
// or of one array of token ids.
type refPrompt struct {
	text string
	ids  []uint32
	set  bool // ids is the prompt
}

func (p *refPrompt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	*p = refPrompt{}
	if b[0] == '"' {
		return json.Unmarshal(b, &p.text)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return err
	}
	if len(elems) == 0 {
		return nil
	}
	switch c := elems[0][0]; {
	case c == '"':
		if len(elems) > 1 {
			return errors.New("a batch")
		}
		return json.Unmarshal(elems[0], &p.text)
	case c == '[':
		if len(elems) > 1 {
			return errors.New("a batch")
		}
		if err := json.Unmarshal(elems[0], &elems); err != nil {
			return err
		}
	}
	p.set = true
	for _, e := range elems {
		var id uint32
		if string(e) == "null" {
			return errors.New("a null token id")
		}
		if err := json.Unmarshal(e, &id); err != nil {
			return err
		}
		p.ids = append(p.ids, id)
	}
	return nil
}

// decodeStd decodes body with encoding/json into a reference, with nothing
// but whitespace after the value, and returns the query it gives.
func decodeStd(body []byte) (indexer.Query, error) {
	var r reference
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		return indexer.Query{}, err
	}
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return indexer.Query{}, errors.New("data after the value")
	}
	q := indexer.Query{
		Model: r.Model, LoRA: r.LoRA, CacheSalt: r.CacheSalt, TokenIDs: r.TokenIDs, Prompt: r.Prompt.text,
		Messages: r.Messages, Pods: r.Pods,
	}
	for _, h := range r.BlockHashes {
		q.BlockHashes = append(q.BlockHashes, uint64(h))
	}
	if r.Prompt.set {
		if len(q.TokenIDs) > 0 {
			return indexer.Query{}, errors.New("token_ids and a prompt of token ids")
		}
		q.TokenIDs = r.Prompt.ids
	}
	return q, nil
}

var wide = querylimit.Limits{MaxTokens: 1 << 30, MaxBlockHashes: 1 << 30}

// check decodes body with Decode and with encoding/json and compares.
func check(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := decodeStd(body)
	var got indexer.Query
	err := Decode(body, &got, wide, nil)
	if err != nil {
		if wantErr == nil {
			t.Fatalf("Decode(%.200q): %v; encoding/json accepts it: %+v", body, err, want)
		}
		return
	}
	if wantErr != nil {
		t.Fatalf("Decode(%.200q) accepts it as %+v; encoding/json: %v", body, got, wantErr)
	}
	if got.Model != want.Model || got.LoRA != want.LoRA || got.CacheSalt != want.CacheSalt || got.Prompt != want.Prompt ||
		!slices.Equal(got.TokenIDs, want.TokenIDs) || !slices.Equal(got.BlockHashes, want.BlockHashes) || !slices.Equal(got.Pods, want.Pods) {
		t.Fatalf("Decode(%.200q) = %+v; encoding/json %+v", body, got, want)
	}
	if len(got.Messages) != len(want.Messages) {
		t.Fatalf("Decode(%.200q): %d messages; encoding/json %d", body, len(got.Messages), len(want.Messages))
	}
	for i, m := range got.Messages {
		w := want.Messages[i]
		if m.Role != w.Role || m.Content.Parts != nil {
			t.Fatalf("Decode(%.200q): message %d = %+v; encoding/json %+v", body, i, m, w)
		}
		// Parts are joined: compare what the indexer renders.
		if g, w := tokenize.AppendFlat(nil, got.Messages[i:i+1]), tokenize.AppendFlat(nil, want.Messages[i:i+1]); !bytes.Equal(g, w) {
			t.Fatalf("Decode(%.200q): message %d renders %q; encoding/json's %q", body, i, g, w)
		}
	}
}

func TestDecodeEqualsEncodingJSON(t *testing.T) {
	for _, body := range testBodies {
		check(t, []byte(body))
	}
	// As deep as encoding/json goes, and one level more, in a field
	// skipped and in a content part.
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		nested := strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1)
		check(t, []byte(`{"x":`+nested+`}`))
		check(t, []byte(`{"x":`+strings.Repeat(`{"a":`, depth-1)+`1`+strings.Repeat(`}`, depth-1)+`}`))
		parts := strings.Repeat("[", depth-5) + strings.Repeat("]", depth-5)
		check(t, []byte(`{"messages":[{"content":[{"type":"text","text":"a","x":`+parts+`}]}]}`))
	}
}

// TestRecordedBodies decodes every recorded request body as it was sent,
// with the fields Decode does not use (max_tokens, stream) in it, and
// each recorded line whole with DecodeRecord.
func TestRecordedBodies(t *testing.T) {
	for _, r := range fixture.Requests(t, "") {
		check(t, r.Body)
		var q indexer.Query
		if err := Decode(r.Body, &q, querylimit.Limits{MaxTokens: 1 << 17, MaxBlockHashes: 8192}, nil); err != nil {
			t.Fatalf("%s:%d: %v", r.File, r.Line, err)
		}
		if q.Model != "sim-model" || len(q.Messages) == 0 {
			t.Fatalf("%s:%d: %+v", r.File, r.Line, q)
		}
		line, err := json.Marshal(map[string]any{"session": 1, "usage": map[string]any{"prompt_tokens": 5}, "request": r.Body, "response": nil})
		if err != nil {
			t.Fatal(err)
		}
		var rec indexer.Query
		if err := DecodeRecord(line, &rec); err != nil {
			t.Fatalf("%s:%d: as a recorded line: %v", r.File, r.Line, err)
		}
		if rec.Model != q.Model || !bytes.Equal(tokenize.AppendFlat(nil, rec.Messages), tokenize.AppendFlat(nil, q.Messages)) {
			t.Fatalf("%s:%d: the recorded line decodes to %+v, the body to %+v", r.File, r.Line, rec, q)
		}
	}
}

func TestDecodeRecord(t *testing.T) {
	for _, tc := range []struct {
		line string
		want indexer.Query
		err  string
	}{
		{`{"model":"m","prompt":"p","max_tokens":3}`, indexer.Query{Model: "m", Prompt: "p"}, ""},
		{`{"turn":0,"request":{"model":"m","cache_salt":"s","messages":[{"role":"user","content":"hi"}]},"usage":null}`,
			indexer.Query{Model: "m", CacheSalt: "s", Messages: []tokenize.Message{{Role: "user", Content: tokenize.TextContent("hi")}}}, ""},
		{` [{"role":"user","content":"hi"}]`, indexer.Query{Messages: []tokenize.Message{{Role: "user", Content: tokenize.TextContent("hi")}}}, ""},
		// A "request" that is not an object is a field like any other.
		{`{"request":"x","model":"m","prompt":"p"}`, indexer.Query{Model: "m", Prompt: "p"}, ""},
		{`{"request":{"model":"m"}`, indexer.Query{}, "want ',' or '}'"},
		{`[{"role":"user"}] x`, indexer.Query{}, "more than one value"},
		{`{"request":{"model":"m"}} {}`, indexer.Query{}, "more than one value"},
		{`[1]`, indexer.Query{}, "message: want an object"},
	} {
		var q indexer.Query
		err := DecodeRecord([]byte(tc.line), &q)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error with %q", tc.line, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.line, err)
		case tc.err == "" && fmt.Sprint(q) != fmt.Sprint(tc.want):
			t.Errorf("%s: %+v, want %+v", tc.line, q, tc.want)
		}
	}
}

func TestHashes(t *testing.T) {
	hs := Hashes{0, 1 << 53, 1<<53 + 1, 1<<64 - 1}
	b, err := json.Marshal(struct {
		H Hashes `json:"h"`
		N Hashes `json:"n"`
	}{H: hs})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"h":["0","9007199254740992","9007199254740993","18446744073709551615"],"n":[]}` {
		t.Errorf("marshalled %s", b)
	}
	var back Hashes
	if err := json.Unmarshal([]byte(`["0","9007199254740992",9007199254740993, "18446744073709551615"]`), &back); err != nil || !slices.Equal(back, hs) {
		t.Errorf("unmarshalled %v, %v", back, err)
	}
	for _, bad := range []string{`["x"]`, `[1.5]`, `["-1"]`, `{}`, `[1] 2`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("%s: accepted as %v", bad, back)
		}
	}
	// What Hashes write, Decode reads.
	body := fmt.Appendf(nil, `{"model":"m","block_hashes":%s}`, AppendHashes(nil, hs))
	var q indexer.Query
	if err := Decode(body, &q, querylimit.Limits{}, nil); err != nil || !slices.Equal(q.BlockHashes, hs) {
		t.Errorf("Decode(%s) = %v, %v", body, q.BlockHashes, err)
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
	// Fields of OpenAI bodies, and any other, skipped at every level.
	`{"model":"m","max_tokens":32,"stream":false,"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","stream":true,"stream_options":{"include_usage":true},"n":2,"temperature":0.7,"top_p":1e-3,"stop":null,"user":"u","seed":-5,"logit_bias":{"50256":-100}}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":["string","null"]}},"required":["a"]}}}],"tool_choice":"auto","prompt":"p"}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"name":"bot","refusal":null}]}`,
	`{"messages":[{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"42","annotations":[]}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,x","detail":"low"}},{"type":"input_audio","input_audio":{"data":"","format":"wav"}}]}]}`,
	`{"model":"m","extra":{"a":[[[{"b":[1,2,{"c":"]}\""}]}]]]},"prompt":"p"}`, `{"x":[}`, `{"x":{"a" 1}}`, `{"x":{1:2}}`, `{"x":[1,]}`, `{"x":{"a":1,}}`,
	`{"x":01}`, `{"x":"\q"}`, `{"x":tru}`, `{"x":[1}`, `{"x":{"a":1]}`, `{"x":}`, `{"x":[[]],"y":{},"z":[{}]}`, `{"x" :[ ] , "y" : { } }`,
	`{"request":{"model":"m","prompt":"p"}}`, `{"TOKEN_IDS":[1],"token_ids":[2]}`, `{"\u006dodel":"m"}`, `{"model\u0000":"m"}`,
	// Block hashes as strings or numbers.
	`{"block_hashes":["0","18446744073709551615",7]}`, `{"block_hashes":["18446744073709551616"]}`, `{"block_hashes":["-1"]}`,
	`{"block_hashes":[""]}`, `{"block_hashes":[" 1"]}`, `{"block_hashes":["1 "]}`, `{"block_hashes":["+1"]}`, `{"block_hashes":["0x1"]}`,
	`{"block_hashes":["007"]}`, `{"block_hashes":["\u0031\u0032"]}`, `{"block_hashes":["1,2",3]}`, `{"block_hashes":["1]"]}`,
	`{"block_hashes":["1.0"]}`, `{"block_hashes":["1e3"]}`, `{"block_hashes":[null,"2"]}`, `{"block_hashes":[true]}`, `{"block_hashes":["\u00e9"]}`,
	`{"block_hashes":["99999999999999999999"]}`, `{"block_hashes":["1","2","3"],"block_hashes":[null,null,null,null]}`,
	// Prompts in every form engines take.
	`{"prompt":["one"]}`, `{"prompt":["one","two"]}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1,2,3]]}`, `{"prompt":[[1],[2]]}`, `{"prompt":[]}`,
	`{"prompt":[[]]}`, `{"prompt":[1,null]}`, `{"prompt":[null]}`, `{"prompt":["a",1]}`, `{"prompt":[1,"a"]}`, `{"prompt":[[1,"a"]]}`,
	`{"prompt":[4294967296]}`, `{"prompt":[-1]}`, `{"prompt":5}`, `{"prompt":{}}`, `{"prompt":[{}]}`, `{"prompt":[true]}`,
	`{"prompt":[1,2],"token_ids":[3]}`, `{"prompt":[1,2],"token_ids":[]}`, `{"token_ids":[3],"prompt":"text"}`, `{"prompt":[1],"prompt":"a"}`,
	`{"prompt":"a","prompt":[1]}`, `{"prompt":[1],"prompt":null}`, `{"prompt":["a"],"prompt":[]}`, `{"prompt":[ [ 7 ] ]}`,
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
		"skipped":       rep(`{"model":"m","prompt":"p"`, `,"\u0078":[1,{"a":"b"}]`, `}`),
		"skipped deep":  rep(`{"model":"m","prompt":"p"`, `,"x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100), `}`),
		"hash strings":  rep(`{"model":"m","block_hashes":["0"`, `,"1"`, `]}`),
		"prompt ids":    rep(`{"model":"m","prompt":[0`, `,1`, `]}`),
	}
}

// FuzzDecodeEqualsEncodingJSON checks Decode against encoding/json on
// match request bodies, seeded from the recorded chats.
func FuzzDecodeEqualsEncodingJSON(f *testing.F) {
	for _, b := range testBodies {
		f.Add([]byte(b))
	}
	for i, r := range fixture.Requests(f, "") {
		if i%25 == 0 {
			f.Add([]byte(r.Body)) // as sent, with max_tokens and stream
		}
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
