// Package client is a Go client of prefixd's query API, for routers and
// endpoint pickers written in Go.
//
// # Basics
//
// Dial connects to a prefixd gRPC address (plaintext unless options say
// otherwise); New wraps a connection the caller owns. Match returns every
// matched pod's blocks, tokens, tiers and score; Score returns pod -> score
// normalized as llm-d's precise-prefix-cache-scorer does, with whether the
// pod is stale or incomplete; both take the same Query. Pods and Stats
// describe the index. Errors are gRPC statuses: check them with
// status.Code (codes.NotFound for an unknown model, InvalidArgument for a
// bad query, ResourceExhausted when the server is at its concurrency limit).
//
// # Caveats
//
// Set a deadline on every call's context: a picker should fall back to
// another scorer rather than wait. A Client is safe for concurrent use.
package client
