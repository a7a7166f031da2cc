package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Message is one chat message.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// Content is a message's content: a string, or OpenAI content parts.
type Content struct {
	// Text is the content when it is a string.
	Text string
	// Parts holds the content parts when it is an array.
	Parts []Part
}

// Part is one OpenAI content part. Only "text" parts are rendered.
type Part struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// TextContent returns string content.
func TextContent(s string) Content { return Content{Text: s} }

// UnmarshalJSON accepts a string, an array of parts, or null.
func (c *Content) UnmarshalJSON(data []byte) error {
	*c = Content{}
	data = bytes.TrimSpace(data)
	switch {
	case len(data) == 0 || string(data) == "null":
		return nil
	case data[0] == '"':
		return json.Unmarshal(data, &c.Text)
	case data[0] == '[':
		if err := json.Unmarshal(data, &c.Parts); err != nil {
			return fmt.Errorf("content parts: %w", err)
		}
		return nil
	}
	return fmt.Errorf("content must be a string or an array of parts, got %.20q", data)
}

// MarshalJSON writes parts when there are some, else the string.
func (c Content) MarshalJSON() ([]byte, error) {
	if c.Parts != nil {
		return json.Marshal(c.Parts)
	}
	return json.Marshal(c.Text)
}

// appendPlain appends the content as the sim renders it: the string when it
// is not empty, else each text part followed by one space.
func (c *Content) appendPlain(b []byte) []byte {
	if c.Text != "" {
		return append(b, c.Text...)
	}
	for i := range c.Parts {
		if c.Parts[i].Type == "text" {
			b = append(b, c.Parts[i].Text...)
			b = append(b, ' ')
		}
	}
	return b
}

// AppendFlat appends the sim's flattening of msgs: "### " + role + ": " +
// content + "\n" per message.
func AppendFlat(dst []byte, msgs []Message) []byte {
	for i := range msgs {
		dst = append(dst, "### "...)
		dst = append(dst, msgs[i].Role...)
		dst = append(dst, ": "...)
		dst = msgs[i].Content.appendPlain(dst)
		dst = append(dst, '\n')
	}
	return dst
}

// Tokenizer tokenizes chats with a reused text buffer. A Tokenizer is not
// safe for concurrent use; the zero value is ready.
type Tokenizer struct {
	buf []byte
}

// AppendChat appends the ids of the flattened msgs to dst and returns it.
func (t *Tokenizer) AppendChat(dst []uint32, msgs []Message) []uint32 {
	t.buf = AppendFlat(t.buf[:0], msgs)
	return appendIDs(dst, t.buf)
}

// ChatRequest is what ParseChat reads from a chat request.
type ChatRequest struct {
	// Model is the body's "model", empty for a bare messages array.
	Model    string
	Messages []Message
}

// ErrNoMessages is returned by ParseChat for input without messages.
var ErrNoMessages = errors.New("no chat messages")

// ParseChat reads an OpenAI chat request body ({"model": ..., "messages":
// [...]}; other fields are ignored) or a bare messages array, with
// encoding/json. prefixd's commands and HTTP read request bodies with
// rpc/querybody instead, which reads completions bodies and the other
// query fields too, under limits; this reading is kept for tests that
// check recordings against the tokenizer.
func ParseChat(data []byte) (ChatRequest, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return ChatRequest{}, fmt.Errorf("%w: empty input", ErrNoMessages)
	}
	var req ChatRequest
	switch data[0] {
	case '[':
		if err := json.Unmarshal(data, &req.Messages); err != nil {
			return ChatRequest{}, fmt.Errorf("messages array: %w", err)
		}
	case '{':
		var body struct {
			Model    string    `json:"model"`
			Messages []Message `json:"messages"`
		}
		if err := json.Unmarshal(data, &body); err != nil {
			return ChatRequest{}, fmt.Errorf("chat request body: %w", err)
		}
		req = ChatRequest{Model: body.Model, Messages: body.Messages}
	default:
		return ChatRequest{}, fmt.Errorf("want a chat request object or a messages array, got %.20q", data)
	}
	if len(req.Messages) == 0 {
		return ChatRequest{}, ErrNoMessages
	}
	return req, nil
}

// AppendChatMax appends the ids of the first limit tokens of the flattened
// msgs to dst and returns it, with over set when the chat holds more than
// limit tokens. Unlike AppendChat it flattens nothing into a buffer: the
// messages' pieces are scanned in place, a token running on from one piece
// into the next, so a chat of any size costs at most limit ids.
func AppendChatMax(dst []uint32, msgs []Message, limit int) (ids []uint32, over bool) {
	sc := scanner{dst: dst, limit: limit}
	for i := range msgs {
		m := &msgs[i]
		sc.write("### ")
		sc.write(m.Role)
		sc.write(": ")
		if m.Content.Text != "" {
			sc.write(m.Content.Text)
		} else {
			for j := range m.Content.Parts {
				if p := &m.Content.Parts[j]; p.Type == "text" {
					sc.write(p.Text)
					sc.write(" ")
				}
			}
		}
		if !sc.write("\n") {
			return sc.dst, true
		}
	}
	return sc.end(), false
}

// Scanner states: between tokens, in a token's run of word bytes, or in
// what may follow a token's head (a punctuation byte or a word run): its
// trailing whitespace.
const (
	scanIdle = iota
	scanWord
	scanTrail
)

// scanner splits text written to it in pieces as next splits the pieces
// concatenated, hashing each token as its bytes come. It stops, with over
// set, where token limit+1 starts.
type scanner struct {
	dst   []uint32
	limit int
	n     int // tokens started
	state uint8
	h     uint32 // FNV-1a of the current token so far
	over  bool
}

// write scans s and reports whether the scanner is still under its limit.
func (sc *scanner) write(s string) bool {
	if sc.over {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		c := classes[b]
		switch sc.state {
		case scanWord:
			if c&classWord != 0 {
				sc.h = (sc.h ^ uint32(b)) * 16777619
				continue
			}
			if c&classSpace != 0 {
				sc.h = (sc.h ^ uint32(b)) * 16777619
				sc.state = scanTrail
				continue
			}
			sc.dst = append(sc.dst, sc.h)
			sc.state = scanIdle
		case scanTrail:
			if c&classSpace != 0 {
				sc.h = (sc.h ^ uint32(b)) * 16777619
				continue
			}
			sc.dst = append(sc.dst, sc.h)
			sc.state = scanIdle
		}
		// Between tokens: b starts one, or is skipped. A punctuation byte
		// is a token's whole head ('_' too, as in next).
		if c&(classPunct|classWord) == 0 {
			continue
		}
		if sc.n >= sc.limit {
			sc.over = true
			return false
		}
		sc.n++
		sc.h = (2166136261 ^ uint32(b)) * 16777619
		sc.state = scanWord
		if c&classPunct != 0 {
			sc.state = scanTrail
		}
	}
	return true
}

// end ends the text: the token being read, if any, is complete.
func (sc *scanner) end() []uint32 {
	if sc.state != scanIdle && !sc.over {
		sc.dst = append(sc.dst, sc.h)
		sc.state = scanIdle
	}
	return sc.dst
}
