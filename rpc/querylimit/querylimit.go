// Package querylimit holds the limits that both query decoders, gRPC's
// (rpc/internal/codec) and JSON's (rpc/querybody), apply while they read a
// query, and the error they report a query over one with.
package querylimit

import "fmt"

// Limits bound what a decoder keeps of a query; 0 is no limit.
type Limits struct {
	// MaxTokens bounds token_ids (and a prompt of token ids), and messages
	// to MaxTokens/4: every message renders to at least 4 tokens ("#",
	// "#", "# " and the ": " after its role), so a chat of more is over
	// the limit.
	MaxTokens int
	// MaxBlockHashes bounds block_hashes.
	MaxBlockHashes int
}

// Error reports a query over a limit, found while decoding it.
type Error struct {
	// Field is "token_ids", "block_hashes" or "messages".
	Field string
	// Limit is MaxBlockHashes for block_hashes, MaxTokens for the others.
	Limit int
}

func (e *Error) Error() string {
	switch e.Field {
	case "block_hashes":
		return fmt.Sprintf("more than %d block hashes", e.Limit)
	case "messages":
		return fmt.Sprintf("more than %d tokens: more than %d messages, each at least 4 tokens", e.Limit, e.Limit/4)
	}
	return fmt.Sprintf("more than %d tokens", e.Limit)
}
