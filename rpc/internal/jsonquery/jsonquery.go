// Package jsonquery decodes the JSON body of POST /v1/match into an
// indexer.Query in one pass over the body's bytes, with the query limits
// applied as it reads and every allocation announced before it is made.
//
// # Basics
//
// Decode accepts what encoding/json accepts for rpc.MatchRequestJSON with
// DisallowUnknownFields (field names matched case-insensitively, the last of
// duplicate fields winning, null leaving a string as it is and a list
// empty, invalid UTF-8 replaced by U+FFFD, unknown fields refused except
// inside content parts) and decodes the same values, which
// FuzzDecodeEqualsEncodingJSON checks. Where encoding/json grows slices by
// doubling and turns every token id into a slice element before a caller
// can count them, Decode sizes each slice from the array it reads, stops at
// the first token id or block hash over the limit, and calls reserve with
// the bytes of each string and slice before allocating it, so that a
// server can refuse a body whose decoded form would not fit its memory
// budget.
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
// through.
package jsonquery

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/rpc/internal/querylimit"
)

// SyntaxError reports a body that is not JSON, or not a match request.
type SyntaxError struct {
	// Offset is the byte of the body where the error was found.
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("at byte %d: %s", e.Offset, e.Msg) }

// Sizes of what Decode allocates besides string bytes, for reserve.
const (
	sizeString  = 16 // a string header in []string
	sizeMessage = 56 // a tokenize.Message
)

// maxDepth bounds the nesting of the values Decode skips (unknown members
// of content parts). encoding/json allows 10000 levels; skipping them
// recursively would grow a goroutine's stack by megabytes.
const maxDepth = 100

// maxNameLen is the longest member name Decode unescapes: the longest
// field name, 12 bytes, written as \u escapes. A longer name with escapes
// matches no field.
const maxNameLen = 6 * 12

// Decode decodes body, a MatchRequestJSON, into q, which it overwrites. It
// calls reserve, when it is not nil, with the bytes each string and slice
// it is about to allocate will hold; an error from reserve ends the decode
// and is returned as it is. Other errors are a *querylimit.Error or a
// *SyntaxError.
func Decode(body []byte, q *indexer.Query, lim querylimit.Limits, reserve func(n int) error) error {
	*q = indexer.Query{}
	d := decoder{b: body, lim: lim, reserve: reserve}
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

type decoder struct {
	b       []byte
	i       int // next byte to read
	lim     querylimit.Limits
	reserve func(int) error
}

func (d *decoder) errorf(format string, args ...any) error {
	return &SyntaxError{Offset: d.i, Msg: fmt.Sprintf(format, args...)}
}

// have describes the input at d.i for an error.
func (d *decoder) have() string {
	if d.i >= len(d.b) {
		return "end of body"
	}
	return fmt.Sprintf("%.24q", d.b[d.i:])
}

func (d *decoder) charge(n int) error {
	if d.reserve == nil || n == 0 {
		return nil
	}
	return d.reserve(n)
}

// ws skips JSON whitespace.
func (d *decoder) ws() {
	b, i := d.b, d.i
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	d.i = i
}

func (d *decoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// literal consumes lit (true, false, null) when it comes next.
func (d *decoder) literal(lit string) bool {
	if string(d.b[d.i:min(d.i+len(lit), len(d.b))]) != lit {
		return false
	}
	d.i += len(lit)
	return true
}

// null consumes a null when it comes next.
func (d *decoder) null() bool { return d.peek() == 'n' && d.literal("null") }

// list reads the elements of an array with elem, d.i at its '['. elem is
// called with d.i at each element.
func (d *decoder) list(what string, elem func(n int) error) error {
	if d.peek() != '[' {
		return d.errorf("%s: want an array, have %s", what, d.have())
	}
	d.i++
	d.ws()
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for n := 0; ; n++ {
		d.ws()
		if err := elem(n); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.errorf("%s: want ',' or ']' after element %d, have %s", what, n, d.have())
		}
	}
}

// object reads the members of an object with member, d.i at its '{'.
// member is called with the member's name decoded and d.i at its value.
func (d *decoder) object(what string, member func(name []byte) error) error {
	if d.peek() != '{' {
		return d.errorf("%s: want an object, have %s", what, d.have())
	}
	d.i++
	d.ws()
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		d.ws()
		if d.peek() != '"' {
			return d.errorf("%s: want a member name, have %s", what, d.have())
		}
		raw, plain, err := d.scanString()
		if err != nil {
			return err
		}
		name := raw
		if !plain && len(raw) <= maxNameLen {
			name = unescape(make([]byte, 0, len(raw)), raw)
		}
		d.ws()
		if d.peek() != ':' {
			return d.errorf("%s: want ':' after member %.40q, have %s", what, name, d.have())
		}
		d.i++
		d.ws()
		if err := member(name); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.errorf("%s: want ',' or '}' after member %.40q, have %s", what, name, d.have())
		}
	}
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

var queryFields = []string{"", "model", "lora", "cache_salt", "token_ids", "block_hashes", "prompt", "messages", "pods"}

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
	return d.object("request", func(name []byte) error {
		switch lookup(queryFields, name) {
		case fieldModel:
			return d.stringOrNull("model", &q.Model)
		case fieldLoRA:
			return d.stringOrNull("lora", &q.LoRA)
		case fieldCacheSalt:
			return d.stringOrNull("cache_salt", &q.CacheSalt)
		case fieldPrompt:
			return d.stringOrNull("prompt", &q.Prompt)
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
		return d.errorf("unknown field %.40q", name)
	})
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

// string reads a string value, allocating it (after reserving its bytes)
// unless it is empty.
func (d *decoder) string(what string) (string, error) {
	if d.peek() != '"' {
		return "", d.errorf("%s: want a string, have %s", what, d.have())
	}
	raw, plain, err := d.scanString()
	if err != nil {
		return "", err
	}
	n := len(raw)
	if !plain {
		n = unescapedLen(raw)
	}
	if err := d.charge(n); err != nil {
		return "", err
	}
	if plain {
		return string(raw), nil
	}
	var sb strings.Builder
	sb.Grow(n)
	unescapeTo(&sb, raw)
	return sb.String(), nil
}

// scanString checks the string at d.i and moves past it. It returns its
// raw contents, and plain when they need no unescaping (no escapes, valid
// UTF-8).
func (d *decoder) scanString() (raw []byte, plain bool, err error) {
	start := d.i + 1
	plain = true
	for i := start; i < len(d.b); {
		// Eight plain bytes at a time: no quote, backslash, control
		// character or non-ASCII byte.
		for i+8 <= len(d.b) && plain8(binary.LittleEndian.Uint64(d.b[i:])) {
			i += 8
		}
		if i >= len(d.b) {
			break
		}
		c := d.b[i]
		switch {
		case c == '"':
			d.i = i + 1
			return d.b[start:i], plain, nil
		case c == '\\':
			plain = false
			if i+1 >= len(d.b) {
				d.i = i
				return nil, false, d.errorf("string: escape at the end of the body")
			}
			switch d.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if hex4(d.b[i+2:]) < 0 {
					d.i = i
					return nil, false, d.errorf(`string: want \u and 4 hex digits, have %s`, d.have())
				}
				i += 6
			default:
				d.i = i
				return nil, false, d.errorf("string: invalid escape %s", d.have())
			}
		case c < ' ':
			d.i = i
			return nil, false, d.errorf("string: control character %q", c)
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d.b[i:])
			if r == utf8.RuneError && size == 1 {
				plain = false
			}
			i += size
		}
	}
	d.i = len(d.b)
	return nil, false, d.errorf("string: not terminated")
}

// plain8 reports whether none of the 8 bytes of x is a quote, a backslash,
// a control character or a non-ASCII byte (the classic SWAR tests: a byte
// is below n when (b - n) borrows into its top bit while b's top bit is
// clear; a byte equals c when b ^ c is below 1).
func plain8(x uint64) bool {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	below := func(x uint64, n uint64) uint64 { return (x - ones*n) &^ x & high }
	special := below(x, 0x20) | below(x^(ones*'"'), 1) | below(x^(ones*'\\'), 1) | x&high
	return special == 0
}

// hex4 returns the value of 4 hex digits at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// u4 returns the rune of a \uXXXX escape at the start of s, or -1.
func u4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	return hex4(s[2:])
}

// decodeEscape decodes the escape at the start of s (checked by
// scanString) as encoding/json does: a surrogate pair is one rune, a lone
// surrogate U+FFFD. It returns the rune, or the byte when r is -1, and the
// bytes of s it used.
func decodeEscape(s []byte) (r rune, c byte, used int) {
	switch s[1] {
	case 'b':
		return -1, '\b', 2
	case 'f':
		return -1, '\f', 2
	case 'n':
		return -1, '\n', 2
	case 'r':
		return -1, '\r', 2
	case 't':
		return -1, '\t', 2
	case 'u':
		r = u4(s)
		if utf16.IsSurrogate(r) {
			if dec := utf16.DecodeRune(r, u4(s[6:])); dec != unicode.ReplacementChar {
				return dec, 0, 12
			}
			return unicode.ReplacementChar, 0, 6
		}
		return r, 0, 6
	}
	return -1, s[1], 2 // '"', '\\', '/'
}

// unescapedLen returns the length of raw (checked by scanString) unescaped.
func unescapedLen(raw []byte) int {
	n := 0
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, _, used := decodeEscape(raw[i:])
			if r < 0 {
				n++
			} else {
				n += utf8.RuneLen(r)
			}
			i += used
		case c < utf8.RuneSelf:
			n++
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			n += utf8.RuneLen(r) // RuneError: 3 bytes for one invalid byte
			i += size
		}
	}
	return n
}

// unescapeTo writes raw (checked by scanString) unescaped to sb.
func unescapeTo(sb *strings.Builder, raw []byte) {
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, b, used := decodeEscape(raw[i:])
			if r < 0 {
				sb.WriteByte(b)
			} else {
				sb.WriteRune(r)
			}
			i += used
		case c < utf8.RuneSelf:
			j := i + 1
			for j < len(raw) && raw[j] != '\\' && raw[j] < utf8.RuneSelf {
				j++
			}
			sb.Write(raw[i:j])
			i = j
		default:
			r, size := utf8.DecodeRune(raw[i:])
			sb.WriteRune(r)
			i += size
		}
	}
}

// unescape appends raw (checked by scanString) unescaped to dst.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\':
			r, b, used := decodeEscape(raw[i:])
			if r < 0 {
				dst = append(dst, b)
			} else {
				dst = utf8.AppendRune(dst, r)
			}
			i += used
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst
}

// uint reads an unsigned integer of at most max, or null (0).
func (d *decoder) uint(what string, max uint64) (uint64, error) {
	if d.null() {
		return 0, nil
	}
	start := d.i
	var v uint64
	for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
		digit := uint64(d.b[d.i] - '0')
		if v > (max-digit)/10 {
			d.i = start
			return 0, d.errorf("%s: want an integer of at most %d, have %s", what, max, d.have())
		}
		v = v*10 + digit
		d.i++
	}
	switch {
	case d.i == start:
		return 0, d.errorf("%s: want an unsigned integer, have %s", what, d.have())
	case d.b[start] == '0' && d.i > start+1:
		d.i = start
		return 0, d.errorf("%s: number with a leading zero: %s", what, d.have())
	}
	switch d.peek() {
	case '.', 'e', 'E':
		d.i = start
		return 0, d.errorf("%s: want an unsigned integer, have %s", what, d.have())
	}
	return v, nil
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
	hs, err := sized(d, prev, d.count(d.lim.MaxBlockHashes), 8)
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
		hs[i], err = d.uint("block_hashes", 1<<64-1)
		return err
	})
	return hs, err
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
				if i < len(b) && b[i] == '\\' {
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
		return d.object("message", func(name []byte) error {
			switch lookup(messageFields, name) {
			case 1:
				return d.stringOrNull("role", &m.Role)
			case 2:
				return d.content(&m.Content)
			}
			return d.errorf("message: unknown field %.40q", name)
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
// Unknown members are skipped, as tokenize.Content's decoding does.
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
		err := d.object("content part", func(name []byte) error {
			field := lookup(partFields, name)
			if field == 0 {
				return d.skip(1)
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

// skip checks and skips any JSON value at d.i, nested depth deep already.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return d.errorf("nested more than %d deep", maxDepth)
	}
	switch c := d.peek(); {
	case c == '"':
		_, _, err := d.scanString()
		return err
	case c == '{':
		return d.object("value", func([]byte) error { return d.skip(depth + 1) })
	case c == '[':
		return d.list("value", func(int) error { return d.skip(depth + 1) })
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	case d.literal("true"), d.literal("false"), d.literal("null"):
		return nil
	}
	return d.errorf("want a JSON value, have %s", d.have())
}

// number checks and skips a JSON number.
func (d *decoder) number() error {
	start := d.i
	digits := func() int {
		n := 0
		for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.peek() == '-' {
		d.i++
	}
	switch {
	case d.peek() == '0':
		d.i++
	case digits() == 0:
		d.i = start
		return d.errorf("want a number, have %s", d.have())
	}
	if d.peek() == '.' {
		d.i++
		if digits() == 0 {
			return d.errorf("want digits after '.', have %s", d.have())
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.i++
		if c := d.peek(); c == '+' || c == '-' {
			d.i++
		}
		if digits() == 0 {
			return d.errorf("want digits in the exponent, have %s", d.have())
		}
	}
	return nil
}
