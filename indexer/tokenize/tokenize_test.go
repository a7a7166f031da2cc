package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/fixture"
)

var sim = regexp.MustCompile(Pattern)

// regexpSpans is the sim's own split: FindAllStringIndex with Pattern.
func regexpSpans(s string) [][2]int {
	var out [][2]int
	for _, m := range sim.FindAllStringIndex(s, -1) {
		out = append(out, [2]int{m[0], m[1]})
	}
	return out
}

func scanSpans(s string) [][2]int {
	var out [][2]int
	for i := 0; ; {
		start, end, ok := Next(s, i)
		if !ok {
			return out
		}
		out = append(out, [2]int{start, end})
		i = end
	}
}

func TestNextMatchesPatternOnEdgeCases(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"   ", nil},
		{"Hello, world!", []string{"Hello", ", ", "world", "!"}},
		{"_foo foo_bar __x", []string{"_", "foo ", "foo_bar ", "_", "_", "x"}},
		{"a\t\n\f\r b", []string{"a\t\n\f\r ", "b"}},
		{"a\vb", []string{"a", "b"}}, // \s has no \v in RE2
		{"héllo wörld", []string{"h", "llo ", "w", "rld"}},
		{"x|y`z", []string{"x", "y", "z"}},
		{"### user: hi\n", []string{"#", "#", "# ", "user", ": ", "hi\n"}},
		{"\xff\xfe12\x80", []string{"12"}},
		{`{"a":[1.5e-3]}`, []string{"{", `"`, "a", `"`, ":", "[", "1", ".", "5e", "-", "3", "]", "}"}},
	}
	for _, c := range cases {
		var got []string
		for _, sp := range scanSpans(c.in) {
			got = append(got, c.in[sp[0]:sp[1]])
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("tokens of %q = %q, want %q", c.in, got, c.want)
		}
		if re := regexpSpans(c.in); !slices.Equal(scanSpans(c.in), re) {
			t.Errorf("spans of %q = %v, regexp says %v", c.in, scanSpans(c.in), re)
		}
	}
}

func TestIDIsFNV1a32(t *testing.T) {
	// FNV-1a 32-bit reference values (the FNV authors' test vectors).
	for in, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := ID(in); got != want {
			t.Errorf("ID(%q) = %#x, want %#x", in, got, want)
		}
	}
	// Token ids seen in the recordings: the first tokens of every chat,
	// "#", "#" and "# " (a_array_random_seedless, first BlockStored).
	if got := AppendIDs(nil, "### "); !slices.Equal(got, []uint32{638357778, 638357778, 399020470}) {
		t.Errorf("ids of %q = %v", "### ", got)
	}
}

func TestParseChat(t *testing.T) {
	body := `{"model":"sim-model","max_tokens":3,"messages":[{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[]}]}`
	req, err := ParseChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "sim-model" || len(req.Messages) != 3 {
		t.Fatalf("got %+v", req)
	}
	flat := string(AppendFlat(nil, req.Messages))
	want := "### system: Be brief.\n### user: Hi there \n### assistant: \n"
	if flat != want {
		t.Errorf("flattened %q, want %q", flat, want)
	}
	bare, err := ParseChat([]byte(` [{"role":"user","content":"Hi"}]`))
	if err != nil || bare.Model != "" || len(bare.Messages) != 1 || bare.Messages[0].Content.Text != "Hi" {
		t.Errorf("bare array: %+v, %v", bare, err)
	}
	for _, bad := range []string{"", "  ", "42", `{"model":"m"}`, `[]`, `{"messages":[{"role":"user","content":7}]}`, `[{"role":`} {
		if _, err := ParseChat([]byte(bad)); err == nil {
			t.Errorf("ParseChat(%q): no error", bad)
		}
	}
	if _, err := ParseChat([]byte(`{"messages":[]}`)); !errors.Is(err, ErrNoMessages) {
		t.Errorf("empty messages: %v, want ErrNoMessages", err)
	}
}

func TestContentJSONRoundTrip(t *testing.T) {
	for _, in := range []string{`"hi"`, `[{"type":"text","text":"a"}]`} {
		var c Content
		if err := json.Unmarshal([]byte(in), &c); err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(c)
		if err != nil || string(out) != in {
			t.Errorf("round trip of %s = %s, %v", in, out, err)
		}
	}
}

func TestAppendChatReusesBuffer(t *testing.T) {
	msgs := []Message{{Role: "user", Content: TextContent("Hello there, how are you?")}}
	var tk Tokenizer
	dst := make([]uint32, 0, 64)
	dst = tk.AppendChat(dst, msgs)
	want := AppendIDs(nil, "### user: Hello there, how are you?\n")
	if !slices.Equal(dst, want) {
		t.Fatalf("AppendChat = %v, want %v", dst, want)
	}
	if n := testing.AllocsPerRun(100, func() { dst = tk.AppendChat(dst[:0], msgs) }); n != 0 {
		t.Errorf("AppendChat allocates %v times per call", n)
	}
}

// recorded is one request of the shared recordings.
type recorded struct {
	file    string
	line    int
	msgs    []Message
	tokens  int // usage.prompt_tokens, -1 when the request failed
	rawText string
}

func loadRequests(t testing.TB) []recorded {
	t.Helper()
	var out []recorded
	for _, r := range fixture.Requests(t, "") {
		req, err := ParseChat(r.Body)
		if err != nil {
			t.Fatalf("%s:%d: %v", r.File, r.Line, err)
		}
		out = append(out, recorded{file: r.File, line: r.Line, msgs: req.Messages, tokens: r.PromptTokens,
			rawText: string(AppendFlat(nil, req.Messages))})
	}
	return out
}

func TestRecordedPromptTokens(t *testing.T) {
	reqs := loadRequests(t)
	var tk Tokenizer
	counted := 0
	for _, r := range reqs {
		ids := tk.AppendChat(nil, r.msgs)
		if Count(r.rawText) != len(ids) {
			t.Errorf("%s:%d: Count %d != %d ids", r.file, r.line, Count(r.rawText), len(ids))
		}
		if r.tokens < 0 {
			continue
		}
		counted++
		if len(ids) != r.tokens {
			t.Errorf("%s:%d: %d tokens, the sim counted %d", r.file, r.line, len(ids), r.tokens)
		}
	}
	// 253 successful requests in a, b and c (their verification.txt).
	if counted != 253 {
		t.Errorf("checked %d requests with usage, want 253", counted)
	}
}

func TestScannerMatchesRegexpOnRecordings(t *testing.T) {
	for _, r := range loadRequests(t) {
		if got, want := scanSpans(r.rawText), regexpSpans(r.rawText); !slices.Equal(got, want) {
			t.Fatalf("%s:%d: scanner and regexp split differently", r.file, r.line)
		}
	}
}

func FuzzTokenizeMatchesRegexp(f *testing.F) {
	for _, s := range []string{"", "_a_ b", "x\v\ty", "é-ü", "### user: hi\n", "a\xffb", "{[(<>)]}", "12_34 _ _"} {
		f.Add(s)
	}
	for _, s := range recordedSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, want := scanSpans(s), regexpSpans(s)
		if !slices.Equal(got, want) {
			t.Fatalf("split of %q: scanner %v, regexp %v", s, got, want)
		}
		ids := AppendIDs(nil, s)
		if len(ids) != len(want) {
			t.Fatalf("%d ids for %d tokens", len(ids), len(want))
		}
		for i, m := range want {
			if ids[i] != ID(s[m[0]:m[1]]) {
				t.Fatalf("id %d of %q differs", i, s)
			}
		}
	})
}

// recordedSeeds returns the starts of a few recorded chats, flattened, or
// nothing when the recordings are not beside the repository.
func recordedSeeds() []string {
	path := filepath.Join("..", "..", "..", "shared", "fixtures", "llm-d-inference-sim", "a_array_random_seedless", "requests.jsonl")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.SplitN(string(data), "\n", 4)[:3] {
		var r struct {
			Request json.RawMessage `json:"request"`
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		req, err := ParseChat(r.Request)
		if err != nil {
			continue
		}
		flat := AppendFlat(nil, req.Messages)
		out = append(out, string(flat[:min(len(flat), 300)]))
	}
	return out
}

func BenchmarkTokenize(b *testing.B) {
	reqs := loadRequests(b)
	var text []byte
	var msgs []Message
	for _, r := range reqs[:20] {
		text = append(text, r.rawText...)
		msgs = append(msgs, r.msgs...)
	}
	s := string(text)
	dst := make([]uint32, 0, len(s))
	b.Run("text", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(s)))
		for b.Loop() {
			dst = AppendIDs(dst[:0], s)
		}
	})
	b.Run("chat", func(b *testing.B) {
		var tk Tokenizer
		b.ReportAllocs()
		b.SetBytes(int64(len(s)))
		for b.Loop() {
			dst = tk.AppendChat(dst[:0], msgs)
		}
	})
	// The bounded forms with a limit above the count: the whole text.
	b.Run("text-max", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(s)))
		for b.Loop() {
			dst, _ = AppendIDsMax(dst[:0], s, len(s))
		}
	})
	b.Run("chat-max", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(s)))
		for b.Loop() {
			dst, _ = AppendChatMax(dst[:0], msgs, len(s))
		}
	})
	b.Run("regexp", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(s)))
		for b.Loop() {
			dst = dst[:0]
			for _, m := range sim.FindAllString(s, -1) {
				dst = append(dst, ID(m))
			}
		}
	})
}

// checkMax checks AppendIDsMax and AppendChatMax against the unbounded
// functions at every limit around the token count.
func checkMax(t *testing.T, s string, msgs []Message) {
	t.Helper()
	full := AppendIDs(nil, s)
	var tk Tokenizer
	chat := tk.AppendChat(nil, msgs)
	for _, limit := range []int{0, 1, len(full) / 2, len(full) - 1, len(full), len(full) + 1, len(chat) / 2, len(chat) - 1, len(chat), 1 << 30} {
		if limit < 0 {
			continue
		}
		got, over := AppendIDsMax(nil, s, limit)
		if want := full[:min(limit, len(full))]; !slices.Equal(got, want) || over != (len(full) > limit) {
			t.Fatalf("AppendIDsMax(%q, %d) = %v, %v; want %v, %v", s, limit, got, over, want, len(full) > limit)
		}
		got, over = AppendChatMax(nil, msgs, limit)
		if want := chat[:min(limit, len(chat))]; !slices.Equal(got, want) || over != (len(chat) > limit) {
			t.Fatalf("AppendChatMax(%q, %d) = %v, %v; want %v, %v", msgs, limit, got, over, want, len(chat) > limit)
		}
	}
}

func TestAppendMax(t *testing.T) {
	for _, s := range []string{"", "  ", "a", "Hello, world!", "_x_ y", "a\tb\n", "é!é"} {
		checkMax(t, s, []Message{{Role: "user", Content: TextContent(s)}})
	}
	// Tokens that run on from one piece of the rendering into the next:
	// trailing whitespace of content and roles, parts, empty pieces.
	for _, msgs := range [][]Message{
		nil,
		{{}},
		{{Role: "a b ", Content: TextContent("x  ")}, {Role: "", Content: TextContent("")}},
		{{Role: "user", Content: Content{Parts: []Part{{Type: "text", Text: "hi"}, {Type: "image_url"}, {Type: "text"}, {Type: "text", Text: "_"}}}}},
		{{Role: "u", Content: Content{Parts: []Part{{Type: "text", Text: "a"}}}}, {Role: "v", Content: TextContent("b\n\n")}},
		testChatMessages(),
	} {
		checkMax(t, string(AppendFlat(nil, msgs)), msgs)
	}
	// With room in dst, nothing is allocated.
	msgs := testChatMessages()
	dst := make([]uint32, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { dst, _ = AppendChatMax(dst[:0], msgs, 10) }); n != 0 {
		t.Errorf("AppendChatMax allocates %v times per call", n)
	}
}

func testChatMessages() []Message {
	return []Message{
		{Role: "system", Content: TextContent("You are brief. ")},
		{Role: "user", Content: TextContent("How long is the Rhine, and where does it flow?")},
	}
}

func TestAppendChatMaxOnRecordings(t *testing.T) {
	var tk Tokenizer
	for _, r := range loadRequests(t) {
		want := tk.AppendChat(nil, r.msgs)
		if got, over := AppendChatMax(nil, r.msgs, len(want)); over || !slices.Equal(got, want) {
			t.Fatalf("%s:%d: AppendChatMax differs from AppendChat", r.file, r.line)
		}
		if got, over := AppendChatMax(nil, r.msgs, len(want)-1); !over || !slices.Equal(got, want[:len(want)-1]) {
			t.Fatalf("%s:%d: AppendChatMax one under the count: over %v", r.file, r.line, over)
		}
	}
}

// FuzzAppendMax renders s as a chat cut in two messages (and as parts) and
// checks the bounded functions against the unbounded ones.
func FuzzAppendMax(f *testing.F) {
	for _, s := range []string{"", "_a_ b", "x\v\ty", "### user: hi\n", "a\xffb", "a  b\n\nc"} {
		f.Add(s, uint8(1))
	}
	for _, s := range recordedSeeds() {
		f.Add(s, uint8(7))
	}
	f.Fuzz(func(t *testing.T, s string, cut uint8) {
		k := int(cut) % (len(s) + 1)
		checkMax(t, s, []Message{
			{Role: s[:k], Content: TextContent(s[k:])},
			{Role: s[k:], Content: Content{Parts: []Part{{Type: "text", Text: s[:k]}, {Type: "text", Text: s[k:]}}}},
		})
	})
}
