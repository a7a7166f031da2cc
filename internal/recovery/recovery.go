// Package recovery turns a panic at a per-connection, per-message or
// per-request boundary into a counted, logged error, so that one hostile
// input that reaches a bug cannot end the process.
//
// A Guard is used from a deferred closure, which is where recover works:
//
//	defer func() {
//		if r := recover(); r != nil {
//			err = g.Error(r, "grpc")
//		}
//	}()
//
// Every recovered panic is logged with its stack and counted in
// prefixd_panics_total{where}. In a test binary the panic is raised again
// once it is counted, so that a bug reached by a test fails it instead of
// being turned into an error the test may not look at; a test of the
// boundary itself calls KeepRecovered.
package recovery

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/promreg"
)

// ErrPanic is wrapped by the errors Guard.Error returns.
var ErrPanic = fmt.Errorf("recovered panic")

// keep is set by KeepRecovered: panics are not raised again in tests.
var keep atomic.Bool

// Guard counts and logs recovered panics. A nil *Guard logs to
// slog.Default() and counts nothing.
type Guard struct {
	log    *slog.Logger
	panics *prometheus.CounterVec // where
}

// New returns a Guard that counts into reg (nil: counts nowhere) and logs
// to log (nil: slog.Default()).
func New(reg prometheus.Registerer, log *slog.Logger) *Guard {
	g := &Guard{
		log: log,
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_panics_total",
			Help: "Panics recovered at a connection, message or request boundary, by where; each is a bug, logged with its stack.",
		}, []string{"where"}),
	}
	if reg != nil {
		g.panics = promreg.Register(reg, g.panics)
	}
	return g
}

// Error counts and logs the recovered value r, raised at boundary where
// (a fixed name: it is a metric label), and returns it as an error
// wrapping ErrPanic. In a test binary it panics again with r, unless
// KeepRecovered was called.
func (g *Guard) Error(r any, where string) error {
	stack := debug.Stack()
	log := slog.Default()
	if g != nil {
		g.panics.WithLabelValues(where).Inc()
		if g.log != nil {
			log = g.log
		}
	}
	log.Error("recovered a panic: this is a bug", "where", where, "panic", fmt.Sprint(r), "stack", string(stack))
	if testing.Testing() && !keep.Load() {
		panic(r)
	}
	return fmt.Errorf("%w in %s: %v", ErrPanic, where, r)
}

// KeepRecovered makes Guards return recovered panics as errors in this
// test binary, as they do in production, until the test ends. Tests that
// use it must not run in parallel with tests that rely on panics being
// raised again.
func KeepRecovered(t testing.TB) {
	keep.Store(true)
	t.Cleanup(func() { keep.Store(false) })
}
