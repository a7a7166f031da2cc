package tokenize

// Pattern is the sim's token regular expression (llm-d-inference-sim
// pkg/tokenizer/tokenizer.go). Next splits text exactly as Go's regexp
// FindAllStringIndex does with it.
const Pattern = `(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`

// Byte classes of the pattern: a punctuation byte is a whole token, word
// bytes (\w: [0-9A-Za-z_]) run together, space bytes (\s: [\t\n\f\r ])
// trail a token. '_' is both: the punctuation alternative comes first, so
// leftmost-first matching makes a leading '_' a token of its own, while
// inside a word it belongs to the word.
const (
	classPunct = 1 << iota
	classWord
	classSpace
)

var classes = func() (c [256]uint8) {
	for _, b := range []byte(`{}:,-.?!;@#$%^&*()+_~/\><[]="'`) {
		c[b] |= classPunct
	}
	for b := '0'; b <= '9'; b++ {
		c[b] |= classWord
	}
	for b := 'a'; b <= 'z'; b++ {
		c[b] |= classWord
		c[b-'a'+'A'] |= classWord
	}
	c['_'] |= classWord
	for _, b := range []byte("\t\n\f\r ") {
		c[b] |= classSpace
	}
	return c
}()

// text is what the scanner reads.
type text interface{ ~string | ~[]byte }

// Next returns the token of s that starts at or after from: s[start:end].
// ok is false when no token is left. Bytes that no token can hold (other
// symbols, whitespace not after a token, non-ASCII) are skipped.
func Next(s string, from int) (start, end int, ok bool) { return next(s, from) }

func next[T text](s T, from int) (start, end int, ok bool) {
	i := from
	for i < len(s) && classes[s[i]]&(classPunct|classWord) == 0 {
		i++
	}
	if i >= len(s) {
		return len(s), len(s), false
	}
	start = i
	if classes[s[i]]&classPunct != 0 {
		i++
	} else {
		for i < len(s) && classes[s[i]]&classWord != 0 {
			i++
		}
	}
	for i < len(s) && classes[s[i]]&classSpace != 0 {
		i++
	}
	return start, i, true
}

// ID returns a token's id: FNV-1a 32-bit of its bytes.
func ID(token string) uint32 { return id(token) }

func id[T text](token T) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(token); i++ {
		h = (h ^ uint32(token[i])) * 16777619
	}
	return h
}

// AppendIDs appends the ids of s's tokens to dst and returns it.
func AppendIDs(dst []uint32, s string) []uint32 { return appendIDs(dst, s) }

func appendIDs[T text](dst []uint32, s T) []uint32 {
	for i := 0; ; {
		start, end, ok := next(s, i)
		if !ok {
			return dst
		}
		dst = append(dst, id(s[start:end]))
		i = end
	}
}

// Count returns the number of tokens in s.
func Count(s string) int {
	n := 0
	for i := 0; ; n++ {
		_, end, ok := next(s, i)
		if !ok {
			return n
		}
		i = end
	}
}

// AppendIDsMax appends the ids of s's first limit tokens to dst and returns
// it, with over set when s holds more than limit tokens. It stops where the
// token after the limit starts, so text of any length costs at most limit
// ids and one scan up to that token.
func AppendIDsMax(dst []uint32, s string, limit int) (ids []uint32, over bool) {
	for i, n := 0, 0; ; n++ {
		start, end, ok := next(s, i)
		if !ok {
			return dst, false
		}
		if n >= limit {
			return dst, true
		}
		dst = append(dst, id(s[start:end]))
		i = end
	}
}
