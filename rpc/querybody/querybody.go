// Package querybody reads the JSON of a prefix query: an OpenAI
// chat-completions or completions request body as it is sent to an
// engine, or prefixd's own query fields, into an indexer.Query, in one
// pass over the body's bytes, with the query limits applied as it reads
// and every allocation announced before it is made.
//
// # Basics
//
// Decode reads the query's fields, model, lora, cache_salt, token_ids,
// block_hashes, prompt, messages and pods, and skips every other field
// (max_tokens, stream, tools, temperature, n, ...) at any nesting, inside
// messages and content parts too. It accepts what encoding/json accepts
// for such a body decoded into a struct of those fields, without
// DisallowUnknownFields (names matched case-insensitively, the last of
// duplicate fields winning, null leaving a field as it is, invalid UTF-8
// replaced by U+FFFD, nesting up to 10000 levels), and decodes the same
// values, which FuzzDecodeEqualsEncodingJSON checks. Two fields take more
// than one form, as engines take them:
//
//   - block_hashes: each hash a JSON number or a string of decimal digits
//     (as protojson writes 64-bit integers: JavaScript's numbers hold
//     integers exactly only up to 2^53); Hashes writes them as strings.
//   - prompt: a string, an array of one string, an array of token ids
//     (decoded as token_ids; a body may not give both), or an array of one
//     array of token ids. A batch of several prompts is refused: a query
//     asks about one prompt.
//
// Where encoding/json grows slices by doubling and turns every token id
// into a slice element before a caller can count them, Decode sizes each
// slice from the array it reads, stops at the first token id or block hash
// over the limit, and calls reserve with the bytes of each string and
// slice before allocating it, so that a server can refuse a body whose
// decoded form would not fit its memory budget. Skipped values cost no
// allocation, however deep.
//
// DecodeRecord reads what prefixd's commands take from files: a body, a
// recorded request line ({"request": body, ...}, as the recordings'
// requests.jsonl hold them), or a bare array of chat messages.
//
// # Caveats
//
// Content parts are not kept as parts: the text parts of a message are
// joined into its Content.Text as the indexer renders them (each part's
// text followed by one space), which renders to the same tokens, while a
// body of a million empty parts costs no more than its bytes. A chat of
// more than MaxTokens/4 messages is refused as over the token limit before
// it is tokenized: every message renders to at least 4 tokens ("#", "#",
// "# " and the ": " after the role). Data after the first JSON value is
// refused, where encoding/json's Decoder.More would let a stray '}' or ']'
// through. A field of the query given with the wrong type (a number for
// model) is an error, as in encoding/json.
package querybody

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/rpc/querylimit"
)

// Sizes of what Decode allocates besides string bytes, for reserve.
const (
	sizeString  = 16 // a string header in []string
	sizeMessage = 56 // a tokenize.Message
)

// unlimited stands for a limit of 0: more than any body holds, and small
// enough to double.
const unlimited = 1 << 40

// Decode decodes body, a query (see the package doc), into q, which it
// overwrites, under lim (0: no limit). It calls reserve, when it is not
// nil, with the bytes each string and slice it is about to allocate will
// hold; an error from reserve ends the decode and is returned as it is.
// Other errors are a *querylimit.Error or a *SyntaxError.
func Decode(body []byte, q *indexer.Query, lim querylimit.Limits, reserve func(n int) error) error {
	*q = indexer.Query{}
	d := decoder{b: body, lim: lim, reserve: reserve}
	if d.lim.MaxTokens <= 0 {
		d.lim.MaxTokens = unlimited
	}
	if d.lim.MaxBlockHashes <= 0 {
		d.lim.MaxBlockHashes = unlimited
	}
	d.ws()
	if d.literal("null") {
		// As encoding/json: null leaves the request empty.
	} else if err := d.query(q); err != nil {
		return err
	}
	d.ws()
	if d.i < len(d.b) {
		return d.errorf("more than one value: %s after the request", d.have())
	}
	return nil
}

// DecodeRecord decodes a query as prefixd's commands read one from a file
// or a line: a body, a recorded request ({"request": body, ...}: only the
// request is read), or a bare array of chat messages. No limits apply.
func DecodeRecord(line []byte, q *indexer.Query) error {
	line = bytes.TrimLeft(line, " \t\r\n")
	if len(line) > 0 && line[0] == '[' {
		*q = indexer.Query{}
		d := decoder{b: line, lim: querylimit.Limits{MaxTokens: unlimited, MaxBlockHashes: unlimited}}
		ms, err := d.messages(nil)
		if err != nil {
			return err
		}
		d.ws()
		if d.i < len(d.b) {
			return d.errorf("more than one value: %s after the messages", d.have())
		}
		q.Messages = ms
		return nil
	}
	if req, ok := recorded(line); ok {
		line = req
	}
	return Decode(line, q, querylimit.Limits{}, nil)
}

// recorded returns the value of the "request" member of the object line,
// when it has one that is an object and the line is that object alone.
func recorded(line []byte) ([]byte, bool) {
	d := decoder{b: line}
	var req []byte
	err := d.object("record", recordFields, func(field int) error {
		start := d.i
		if err := d.skip(); err != nil {
			return err
		}
		if field == 1 && line[start] == '{' {
			req = line[start:d.i]
		}
		return nil
	})
	d.ws()
	return req, err == nil && req != nil && d.i == len(d.b)
}

type decoder struct {
	b       []byte
	i       int // next byte to read
	depth   int // objects and arrays open at d.i
	lim     querylimit.Limits
	reserve func(int) error

	// prompt holds a prompt of token ids, set when promptSet, decoded
	// apart from token_ids until the body is read.
	prompt    []uint32
	promptSet bool

	open levels // for skip
}

// Fields of the request. Names match as encoding/json matches them: an
// exact match, else a case-insensitive one.
const (
	fieldUnknown = iota
	fieldModel
	fieldLoRA
	fieldCacheSalt
	fieldTokenIDs
	fieldBlockHashes
	fieldPrompt
	fieldMessages
	fieldPods
)

var (
	queryFields  = []string{"", "model", "lora", "cache_salt", "token_ids", "block_hashes", "prompt", "messages", "pods"}
	recordFields = []string{"", "request"}
)

// lookup returns the index in fields of name, 0 when it is none of them.
func lookup(fields []string, name []byte) int {
	for i, f := range fields {
		if i > 0 && string(name) == f {
			return i
		}
	}
	for i, f := range fields {
		if i > 0 && bytes.EqualFold(name, []byte(f)) {
			return i
		}
	}
	return 0
}

func (d *decoder) query(q *indexer.Query) error {
	err := d.object("request", queryFields, func(field int) error {
		switch field {
		case fieldModel:
			return d.stringOrNull("model", &q.Model)
		case fieldLoRA:
			return d.stringOrNull("lora", &q.LoRA)
		case fieldCacheSalt:
			return d.stringOrNull("cache_salt", &q.CacheSalt)
		case fieldPrompt:
			return d.promptValue(&q.Prompt)
		case fieldTokenIDs:
			ids, err := d.tokenIDs(q.TokenIDs)
			q.TokenIDs = ids
			return err
		case fieldBlockHashes:
			hs, err := d.blockHashes(q.BlockHashes)
			q.BlockHashes = hs
			return err
		case fieldMessages:
			ms, err := d.messages(q.Messages)
			q.Messages = ms
			return err
		case fieldPods:
			ps, err := d.pods(q.Pods)
			q.Pods = ps
			return err
		}
		return d.skip()
	})
	if err != nil || !d.promptSet {
		return err
	}
	if len(q.TokenIDs) > 0 {
		return d.errorf("the body gives both token_ids and a prompt of token ids: give one")
	}
	q.TokenIDs = d.prompt
	return nil
}

// stringOrNull reads a string into *s; null leaves *s as it is.
func (d *decoder) stringOrNull(what string, s *string) error {
	if d.null() {
		return nil
	}
	v, err := d.string(what)
	if err == nil {
		*s = v
	}
	return err
}

// promptValue reads a prompt: text into *text, token ids into d.prompt;
// null leaves both as they are, any other value replaces both.
func (d *decoder) promptValue(text *string) error {
	switch d.peek() {
	case 'n':
		if d.null() {
			return nil
		}
	case '"':
		s, err := d.string("prompt")
		*text, d.prompt, d.promptSet = s, nil, false
		return err
	case '[':
		*text, d.prompt, d.promptSet = "", nil, false
		return d.promptArray(text)
	}
	return d.errorf("prompt: want a string or an array, have %s", d.have())
}

// promptArray reads an array prompt: of one string, of token ids, or of
// one array of token ids; its first element says which.
func (d *decoder) promptArray(text *string) error {
	start := d.i
	d.i++
	d.ws()
	first := d.peek()
	d.i = start
	switch {
	case first == ']':
		return d.list("prompt", func(int) error { return nil }) // an empty prompt
	case first == '"':
		n := 0
		err := d.list("prompt", func(i int) error {
			if n++; n > 1 {
				return d.errorf("prompt: a batch of more than one prompt: a query asks about one")
			}
			if d.peek() != '"' {
				return d.errorf("prompt: element %d: want a string, as the first, have %s", i, d.have())
			}
			s, err := d.string("prompt")
			*text = s
			return err
		})
		return err
	case first == '[':
		n := 0
		return d.list("prompt", func(i int) error {
			if n++; n > 1 {
				return d.errorf("prompt: a batch of more than one prompt of token ids: a query asks about one")
			}
			if d.peek() != '[' {
				return d.errorf("prompt: element %d: want an array of token ids, as the first, have %s", i, d.have())
			}
			return d.promptIDs()
		})
	case first == '-' || '0' <= first && first <= '9':
		return d.promptIDs()
	}
	return d.errorf("prompt: want an array of strings or of token ids, have %s", d.have())
}

// promptIDs reads a prompt of token ids, at most MaxTokens of them, into
// d.prompt; null elements are refused.
func (d *decoder) promptIDs() error {
	ids, err := sized(d, []uint32(nil), d.count(d.lim.MaxTokens), 4)
	if err != nil {
		return err
	}
	err = d.list("prompt", func(i int) error {
		if i >= d.lim.MaxTokens {
			return &querylimit.Error{Field: "token_ids", Limit: d.lim.MaxTokens}
		}
		var err error
		if ids, err = extend(d, ids, 4); err != nil {
			return err
		}
		if d.peek() == 'n' {
			return d.errorf("prompt: want a token id, have %s", d.have())
		}
		v, err := d.uint("prompt", 1<<32-1)
		ids[i] = uint32(v)
		return err
	})
	d.prompt, d.promptSet = ids, true
	return err
}

// count returns how many elements the array of numbers at d.i seems to
// hold, for sizing a slice: the commas before its first ']' plus one, at
// most max. Elements are not checked: the array is read again, element by
// element, to fill the slice.
func (d *decoder) count(max int) int {
	rest := d.b[d.i+1:]
	if end := bytes.IndexByte(rest, ']'); end >= 0 {
		rest = rest[:end]
	}
	if len(bytes.TrimLeft(rest, " \t\n\r")) == 0 {
		return 0
	}
	// Commas in at most what max+1 elements of one byte and a comma
	// span: bytes.Count is fast, and bounded this way.
	if len(rest) > 2*max+2 {
		rest = rest[:2*max+2]
	}
	return min(bytes.Count(rest, []byte{','})+1, max)
}

// sized returns a slice of length 0 with room for n elements: prev's
// array when it has room, as encoding/json reuses it for a field given
// twice, else a new one (reserved first) holding prev's elements up to its
// capacity. A null element then keeps what prev held at its index, as in
// encoding/json.
func sized[T any](d *decoder, prev []T, n, size int) ([]T, error) {
	if cap(prev) >= n {
		return prev[:0], nil
	}
	if err := d.charge(size * n); err != nil {
		return nil, err
	}
	s := make([]T, n)
	copy(s, prev[:cap(prev)])
	return s[:0], nil
}

// extend returns s one element longer, in an array twice as large
// (reserved first) when it is full: as encoding/json grows a slice, what
// the array held past s's length stays, and a new array is zero there.
func extend[T any](d *decoder, s []T, size int) ([]T, error) {
	if len(s) < cap(s) {
		return s[:len(s)+1], nil
	}
	n := 2*cap(s) + 1
	if err := d.charge(size * n); err != nil {
		return s, err
	}
	grown := make([]T, len(s)+1, n)
	copy(grown, s)
	return grown, nil
}

// tokenIDs reads token_ids, at most MaxTokens of them; null is none.
func (d *decoder) tokenIDs(prev []uint32) ([]uint32, error) {
	if d.null() {
		return nil, nil
	}
	if d.peek() != '[' {
		return nil, d.errorf("token_ids: want an array, have %s", d.have())
	}
	ids, err := sized(d, prev, d.count(d.lim.MaxTokens), 4)
	if err != nil {
		return nil, err
	}
	err = d.list("token_ids", func(i int) error {
		if i >= d.lim.MaxTokens {
			return &querylimit.Error{Field: "token_ids", Limit: d.lim.MaxTokens}
		}
		var err error
		if ids, err = extend(d, ids, 4); err != nil {
			return err
		}
		if d.null() {
			return nil
		}
		v, err := d.uint("token_ids", 1<<32-1)
		ids[i] = uint32(v)
		return err
	})
	return ids, err
}

// blockHashes reads block_hashes, at most MaxBlockHashes; null is none.
func (d *decoder) blockHashes(prev []uint64) ([]uint64, error) {
	if d.null() {
		return nil, nil
	}
	if d.peek() != '[' {
		return nil, d.errorf("block_hashes: want an array, have %s", d.have())
	}
	var n int
	if bytes.HasPrefix(bytes.TrimLeft(d.b[d.i+1:], " \t\n\r"), []byte{'"'}) {
		n = min(d.countValues(d.lim.MaxBlockHashes), d.lim.MaxBlockHashes) // strings may hold commas
	} else {
		n = d.count(d.lim.MaxBlockHashes)
	}
	hs, err := sized(d, prev, n, 8)
	if err != nil {
		return nil, err
	}
	err = d.list("block_hashes", func(i int) error {
		if i >= d.lim.MaxBlockHashes {
			return &querylimit.Error{Field: "block_hashes", Limit: d.lim.MaxBlockHashes}
		}
		var err error
		if hs, err = extend(d, hs, 8); err != nil {
			return err
		}
		if d.null() {
			return nil
		}
		hs[i], err = d.hash("block_hashes")
		return err
	})
	return hs, err
}

// hash reads a 64-bit hash: a JSON number, or a string of decimal digits
// as protojson writes 64-bit integers (leading zeros allowed, as
// strconv.ParseUint allows them).
func (d *decoder) hash(what string) (uint64, error) {
	if d.peek() != '"' {
		return d.uint(what, 1<<64-1)
	}
	start := d.i
	raw, plain, err := d.scanString()
	if err != nil {
		return 0, err
	}
	v, ok := parseDecimal(raw, plain)
	if !ok {
		d.i = start
		return 0, d.errorf("%s: want an integer in 0..18446744073709551615, or one as a string, have %s", what, d.have())
	}
	return v, nil
}

// parseDecimal parses the raw contents of a string (checked by
// scanString) as a decimal uint64; escapes of digits count as digits.
func parseDecimal(raw []byte, plain bool) (uint64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(raw); {
		c := raw[i]
		if c == '\\' && !plain {
			r, b, used := decodeEscape(raw[i:])
			if r >= 0 {
				b = 0 // not a digit
				if '0' <= r && r <= '9' {
					b = byte(r)
				}
			}
			c, i = b, i+used
		} else {
			i++
		}
		if c < '0' || c > '9' {
			return 0, false
		}
		digit := uint64(c - '0')
		if v > (1<<64-1-digit)/10 {
			return 0, false
		}
		v = v*10 + digit
	}
	return v, true
}

// countValues returns how many elements the array at d.i seems to hold,
// at most max+1, for sizing a slice: the commas outside strings and
// nested values, plus one. It checks nothing (the array is read again,
// element by element, to fill the slice, and that read refuses what is
// not JSON) and leaves d.i where it was.
func (d *decoder) countValues(max int) int {
	b := d.b
	depth, n, empty := 0, 1, true
	for i := d.i + 1; i < len(b); i++ {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			// To the closing quote: eight plain bytes at a time, an escape
			// and the byte it escapes at once.
			for i++; i < len(b) && b[i] != '"'; i++ {
				for i+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[i:])) {
					i += 8
				}
				if i >= len(b) || b[i] == '"' {
					break
				}
				if b[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
		case ']', '}':
			if depth == 0 {
				if empty {
					return 0
				}
				return n
			}
			depth--
		case ',':
			if depth == 0 {
				if n++; n > max {
					return n
				}
			}
		}
		empty = false
	}
	return n
}

// pods reads pods; null is none.
func (d *decoder) pods(prev []string) ([]string, error) {
	if d.null() {
		return nil, nil
	}
	ps, err := sized(d, prev, d.countValues(math.MaxInt-1), sizeString)
	if err != nil {
		return nil, err
	}
	err = d.list("pods", func(i int) error {
		var err error
		if ps, err = extend(d, ps, sizeString); err != nil {
			return err
		}
		return d.stringOrNull("pods", &ps[i])
	})
	return ps, err
}

var (
	messageFields = []string{"", "role", "content"}
	partFields    = []string{"", "type", "text"}
)

// messages reads messages, at most MaxTokens/4 of them; null is none.
func (d *decoder) messages(prev []tokenize.Message) ([]tokenize.Message, error) {
	if d.null() {
		return nil, nil
	}
	ms, err := sized(d, prev, min(d.countValues(d.lim.MaxTokens/4), d.lim.MaxTokens/4), sizeMessage)
	if err != nil {
		return nil, err
	}
	err = d.list("messages", func(i int) error {
		if i >= d.lim.MaxTokens/4 {
			return &querylimit.Error{Field: "messages", Limit: d.lim.MaxTokens}
		}
		var err error
		if ms, err = extend(d, ms, sizeMessage); err != nil {
			return err
		}
		if d.null() {
			return nil
		}
		m := &ms[i]
		return d.object("message", messageFields, func(field int) error {
			switch field {
			case 1:
				return d.stringOrNull("role", &m.Role)
			case 2:
				return d.content(&m.Content)
			}
			return d.skip() // name, tool_calls, tool_call_id, ...
		})
	})
	return ms, err
}

// content reads a message's content: a string, an array of parts (their
// text joined, see the package doc) or null.
func (d *decoder) content(c *tokenize.Content) error {
	*c = tokenize.Content{}
	switch d.peek() {
	case 'n':
		if d.null() {
			return nil
		}
	case '"':
		s, err := d.string("content")
		c.Text = s
		return err
	case '[':
		return d.parts(c)
	}
	return d.errorf("content: want a string or an array of parts, have %s", d.have())
}

// parts reads content parts into c.Text: each "text" part's text followed
// by one space, as tokenize renders parts. The array is read twice: once
// for the length of the joined text, once to write it.
func (d *decoder) parts(c *tokenize.Content) error {
	start := d.i
	n := 0
	if err := d.eachPart(func(text []byte, plain bool) {
		if plain {
			n += len(text) + 1
		} else {
			n += unescapedLen(text) + 1
		}
	}); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if err := d.charge(n); err != nil {
		return err
	}
	d.i = start
	var sb strings.Builder
	sb.Grow(n)
	err := d.eachPart(func(text []byte, plain bool) {
		if plain {
			sb.Write(text)
		} else {
			unescapeTo(&sb, text)
		}
		sb.WriteByte(' ')
	})
	c.Text = sb.String()
	return err
}

// eachPart reads an array of content parts, calling text with the raw text
// of each "text" part (the last of duplicate members, as encoding/json).
// Other members are skipped (image_url, input_audio, ...).
func (d *decoder) eachPart(text func(raw []byte, plain bool)) error {
	return d.list("content parts", func(int) error {
		if d.null() {
			return nil
		}
		var (
			typ              []byte
			typPlain         bool
			raw              []byte
			rawPlain, isText bool
		)
		err := d.object("content part", partFields, func(field int) error {
			if field == 0 {
				return d.skip()
			}
			if d.null() {
				return nil
			}
			if d.peek() != '"' {
				return d.errorf("content part: %s: want a string, have %s", partFields[field], d.have())
			}
			s, plain, err := d.scanString()
			if err != nil {
				return err
			}
			if field == 1 {
				typ, typPlain = s, plain
			} else {
				raw, rawPlain, isText = s, plain, true
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !typPlain && len(typ) <= 6*len("text") {
			typ = unescape(make([]byte, 0, len(typ)), typ)
		}
		if string(typ) == "text" {
			if !isText {
				raw, rawPlain = nil, true
			}
			text(raw, rawPlain)
		}
		return nil
	})
}
