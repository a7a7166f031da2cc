package rpc

import (
	"flag"
	"fmt"
	"log/slog"
)

// Limits bound what one query may ask and how many run at once.
type Limits struct {
	// MaxTokens bounds a query's token ids, given or tokenized from text.
	MaxTokens int
	// MaxBlockHashes bounds a query's block hashes.
	MaxBlockHashes int
	// MaxMessageBytes bounds a gRPC request message and an HTTP body.
	MaxMessageBytes int
	// MaxConcurrent bounds the queries in flight, gRPC and HTTP together;
	// one more is refused at once rather than queued.
	MaxConcurrent int
}

// DefaultLimits are 128k tokens (8k blocks of 16) per query, 8192 block
// hashes, 4 MiB messages and 512 concurrent queries.
func DefaultLimits() Limits {
	return Limits{MaxTokens: 128 << 10, MaxBlockHashes: 8192, MaxMessageBytes: 4 << 20, MaxConcurrent: 512}
}

// AddFlags registers the limits' flags on fs, with DefaultLimits as defaults.
func (l *Limits) AddFlags(fs *flag.FlagSet) {
	d := DefaultLimits()
	fs.IntVar(&l.MaxTokens, "query-max-tokens", d.MaxTokens, "most token ids a query may give or its text may tokenize to")
	fs.IntVar(&l.MaxBlockHashes, "query-max-block-hashes", d.MaxBlockHashes, "most block hashes a query may give")
	fs.IntVar(&l.MaxMessageBytes, "query-max-message-bytes", d.MaxMessageBytes, "largest gRPC query message or HTTP body, in bytes")
	fs.IntVar(&l.MaxConcurrent, "query-max-concurrent", d.MaxConcurrent, "most queries answered at once (gRPC and HTTP); more are refused with ResourceExhausted / 429")
}

// Validate reports the first limit that is not positive.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max tokens", l.MaxTokens},
		{"max block hashes", l.MaxBlockHashes},
		{"max message bytes", l.MaxMessageBytes},
		{"max concurrent queries", l.MaxConcurrent},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s %d: want > 0", f.name, f.v)
		}
	}
	return nil
}

// IngestStats are the figures of Stats the indexer does not know.
type IngestStats struct {
	// BatchesPerSecond and EventsPerSecond are recent ingest rates.
	BatchesPerSecond float64
	EventsPerSecond  float64
	// MemoryBytes is the store's estimate of its memory; 0 when it gives
	// none, and Stats reports the runtime's heap in use instead.
	MemoryBytes uint64
}

// StatsSource supplies ingest rates and the store's memory estimate.
type StatsSource interface {
	IngestStats() IngestStats
}

// Options configure a Server.
type Options struct {
	Limits Limits
	// Metrics may be nil: NewMetrics(nil) is used.
	Metrics *Metrics
	// Stats may be nil: Stats then reports zero rates and the heap in use.
	Stats StatsSource
	// Log may be nil: nothing is logged.
	Log *slog.Logger
}

// DefaultOptions returns DefaultLimits and nothing else.
func DefaultOptions() Options { return Options{Limits: DefaultLimits()} }
