package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/prefixd/prefixd/internal/recovery"
)

// Source configures one source endpoint: a publisher prefixd connects to.
type Source struct {
	// Name names the pod of messages whose topic names none; empty means
	// the endpoint itself.
	Name string
	// Model is the model such a pod serves; empty means Options.DefaultModel.
	Model string
	// Replay is the publisher's replay endpoint (a ROUTER), or empty.
	Replay string
}

// Options configure a Pipeline. The zero value works: zero fields take the
// defaults of DefaultOptions.
type Options struct {
	// Workers is the number of goroutines applying batches; each pod is
	// served by exactly one. Zero means GOMAXPROCS*2.
	Workers int
	// WorkerQueue bounds the messages waiting for one worker.
	WorkerQueue int
	// Sources holds per-source settings by transport.Message.Source (the
	// endpoint connected to, or the address bound).
	Sources map[string]Source
	// Replay maps pod names to replay endpoints, for pods whose publishers
	// connect to a bound address (their Source is shared). A Source's own
	// Replay takes precedence.
	Replay map[string]string
	// DefaultModel is the model of pods whose topic and Source name none.
	DefaultModel string
	// ReplayTimeout bounds one replay request.
	ReplayTimeout time.Duration
	// PodTimeout is how long a pod whose publisher connection closed may
	// stay away before it leaves the index, with its blocks and series;
	// negative keeps such pods for good. Zero means DefaultOptions'.
	PodTimeout time.Duration
	// TrustTopics accepts a kv@IP:PORT@MODEL topic from a publisher that
	// connected to a bound address whatever its source address. By default
	// such a message is accepted only when IP is the connection's source
	// address, so that a publisher writes only its own pods; NAT and
	// proxies between replicas and prefixd need TrustTopics.
	TrustTopics bool
	// Recovery counts and logs a panic while handling a message; nil
	// logs it to Logger and counts nothing.
	Recovery *recovery.Guard
	// Logger receives gaps, resets and failures; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns the options zero fields are filled from.
func DefaultOptions() Options {
	return Options{
		Workers:       runtime.GOMAXPROCS(0) * 2,
		WorkerQueue:   1024,
		DefaultModel:  "default",
		ReplayTimeout: 5 * time.Second,
		PodTimeout:    5 * time.Minute,
	}
}

// withDefaults fills zero fields from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Workers == 0 {
		o.Workers = d.Workers
	}
	if o.WorkerQueue == 0 {
		o.WorkerQueue = d.WorkerQueue
	}
	if o.DefaultModel == "" {
		o.DefaultModel = d.DefaultModel
	}
	if o.ReplayTimeout == 0 {
		o.ReplayTimeout = d.ReplayTimeout
	}
	if o.PodTimeout == 0 {
		o.PodTimeout = d.PodTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every option out of range, after defaults are applied.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers must be at least 1; have %d", o.Workers))
	}
	if o.WorkerQueue < 1 {
		errs = append(errs, fmt.Errorf("worker queue must be at least 1; have %d", o.WorkerQueue))
	}
	if o.ReplayTimeout < 0 {
		errs = append(errs, fmt.Errorf("replay timeout must be positive; have %v", o.ReplayTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid ingest options: %w", err)
	}
	return nil
}
