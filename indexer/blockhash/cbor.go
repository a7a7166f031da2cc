package blockhash

import "slices"

// Canonical CBOR (RFC 8949 section 4.2.1: every head in its shortest form),
// written by hand for the few shapes the chains hash: unsigned and negative
// integers, byte and text strings, arrays, two-entry maps and null. The llm-d
// chain streams these bytes straight into FNV-64a; the vLLM chain appends
// them to a reused buffer.

// CBOR major types in the initial byte's top three bits.
const (
	majorUint  byte = 0 << 5
	majorNeg   byte = 1 << 5
	majorBytes byte = 2 << 5
	majorText  byte = 3 << 5
	majorArray byte = 4 << 5
	majorMap   byte = 5 << 5
	cborNull   byte = 0xf6
)

// appendHead appends the shortest head of major type major with argument v.
func appendHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return append(b, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(b, major|27, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// appendTokens appends token ids as CBOR unsigned integers. It is
// appendHead per token, inlined: the calls were most of a vLLM block's cost.
// Sim token ids are FNV-32 values, nearly all above 0xffff, so that case
// comes first.
func appendTokens(b []byte, tokens []uint32) []byte {
	b = slices.Grow(b, 5*len(tokens))
	for _, t := range tokens {
		switch {
		case t > 0xffff:
			b = append(b, majorUint|26, byte(t>>24), byte(t>>16), byte(t>>8), byte(t))
		case t > 0xff:
			b = append(b, majorUint|25, byte(t>>8), byte(t))
		case t >= 24:
			b = append(b, majorUint|24, byte(t))
		default:
			b = append(b, majorUint|byte(t))
		}
	}
	return b
}

// appendInt appends v as an unsigned (v >= 0) or negative (-1-n) integer.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendHead(b, majorUint, uint64(v))
	}
	return appendHead(b, majorNeg, uint64(-1-v))
}

// appendText appends s as a text string.
func appendText(b []byte, s string) []byte {
	b = appendHead(b, majorText, uint64(len(s)))
	return append(b, s...)
}

// FNV-64a (the Fowler-Noll-Vo 1a hash, 64 bits) as a stream: each function
// takes the state so far and returns it after hashing more bytes.
const (
	fnvOffset64 uint64 = 14695981039346656037
	fnvPrime64  uint64 = 1099511628211
)

func fnvByte(h uint64, c byte) uint64 { return (h ^ uint64(c)) * fnvPrime64 }

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime64
	}
	return h
}

// fnvHead hashes the shortest head of major type major with argument v.
func fnvHead(h uint64, major byte, v uint64) uint64 {
	switch {
	case v < 24:
		return fnvByte(h, major|byte(v))
	case v <= 0xff:
		h = fnvByte(h, major|24)
		return fnvByte(h, byte(v))
	case v <= 0xffff:
		h = fnvByte(h, major|25)
		h = fnvByte(h, byte(v>>8))
		return fnvByte(h, byte(v))
	case v <= 0xffffffff:
		return fnvWord(fnvByte(h, major|26), uint32(v))
	}
	h = fnvByte(h, major|27)
	h = fnvWord(h, uint32(v>>32))
	return fnvWord(h, uint32(v))
}

// fnvWord hashes the four bytes of v, most significant first.
func fnvWord(h uint64, v uint32) uint64 {
	h = (h ^ uint64(v>>24)) * fnvPrime64
	h = (h ^ uint64(v>>16&0xff)) * fnvPrime64
	h = (h ^ uint64(v>>8&0xff)) * fnvPrime64
	return (h ^ uint64(v&0xff)) * fnvPrime64
}

// fnvToken hashes a token id as a CBOR unsigned integer. Sim token ids are
// FNV-32 values, nearly all above 0xffff, so that case comes first.
func fnvToken(h uint64, t uint32) uint64 {
	if t > 0xffff {
		return fnvWord(fnvByte(h, majorUint|26), t)
	}
	return fnvHead(h, majorUint, uint64(t))
}

func fnvInt(h uint64, v int64) uint64 {
	if v >= 0 {
		return fnvHead(h, majorUint, uint64(v))
	}
	return fnvHead(h, majorNeg, uint64(-1-v))
}

func fnvText(h uint64, s string) uint64 {
	return fnvString(fnvHead(h, majorText, uint64(len(s))), s)
}
