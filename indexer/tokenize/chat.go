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
// [...]}; other fields are ignored) or a bare messages array.
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
