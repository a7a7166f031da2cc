package rpc

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prefixd/prefixd/internal/recovery"
)

// Limits bound what one query may ask, and how many queries and how many
// bytes of them are in flight at once.
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
	// MaxInflightBytes bounds the memory that queries in flight hold,
	// gRPC and HTTP together: each query reserves its body or message
	// before reading it (a gRPC message, whose size is known only once
	// read, MaxMessageBytes) and what decoding it allocates before
	// allocating it, and a query that does not fit is refused at once.
	// It must leave room for a message of MaxMessageBytes read and
	// decoded: at least twice MaxMessageBytes.
	MaxInflightBytes int
	// ReadTimeout bounds how long a query's HTTP body or gRPC message
	// may take to arrive (a gRPC call's deadline is cut to it): a client
	// that sends slowly holds a concurrency slot and its share of the
	// byte budget meanwhile.
	ReadTimeout time.Duration
}

// DefaultLimits are 128k tokens (8k blocks of 16) per query, 8192 block
// hashes, 4 MiB messages, 512 concurrent queries and 256 MiB of them in
// flight, each arriving within 30 s.
func DefaultLimits() Limits {
	return Limits{
		MaxTokens: 128 << 10, MaxBlockHashes: 8192, MaxMessageBytes: 4 << 20,
		MaxConcurrent: 512, MaxInflightBytes: 256 << 20, ReadTimeout: 30 * time.Second,
	}
}

// AddFlags registers the limits' flags on fs, with DefaultLimits as defaults.
func (l *Limits) AddFlags(fs *flag.FlagSet) {
	d := DefaultLimits()
	fs.IntVar(&l.MaxTokens, "query-max-tokens", d.MaxTokens, "most token ids a query may give or its text may tokenize to")
	fs.IntVar(&l.MaxBlockHashes, "query-max-block-hashes", d.MaxBlockHashes, "most block hashes a query may give")
	fs.IntVar(&l.MaxMessageBytes, "query-max-message-bytes", d.MaxMessageBytes, "largest gRPC query message or HTTP body, in bytes")
	fs.IntVar(&l.MaxConcurrent, "query-max-concurrent", d.MaxConcurrent, "most queries answered at once (gRPC and HTTP); more are refused with ResourceExhausted / 429")
	fs.IntVar(&l.MaxInflightBytes, "query-max-inflight-bytes", d.MaxInflightBytes, "most bytes that queries in flight may hold, read and decoded (gRPC and HTTP); a query that does not fit is refused with ResourceExhausted / 429")
	fs.DurationVar(&l.ReadTimeout, "query-read-timeout", d.ReadTimeout, "how long a query's HTTP body or gRPC message may take to arrive (gRPC deadlines are cut to it)")
}

// Validate reports the first limit that is not positive, or a
// MaxInflightBytes below twice MaxMessageBytes.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max tokens", l.MaxTokens},
		{"max block hashes", l.MaxBlockHashes},
		{"max message bytes", l.MaxMessageBytes},
		{"max concurrent queries", l.MaxConcurrent},
		{"max inflight bytes", l.MaxInflightBytes},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s %d: want > 0", f.name, f.v)
		}
	}
	if l.ReadTimeout <= 0 {
		return fmt.Errorf("read timeout %v: want > 0", l.ReadTimeout)
	}
	if l.MaxInflightBytes/2 < l.MaxMessageBytes {
		return fmt.Errorf("max inflight bytes %d: want at least twice max message bytes (%d), room to read and decode one largest query", l.MaxInflightBytes, l.MaxMessageBytes)
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
	// Recovery counts and logs a panic while answering a query, which is
	// answered Internal (gRPC) or 500 (HTTP). Nil logs to slog.Default and
	// counts nothing.
	Recovery *recovery.Guard
}

// DefaultOptions returns DefaultLimits and nothing else.
func DefaultOptions() Options { return Options{Limits: DefaultLimits()} }
