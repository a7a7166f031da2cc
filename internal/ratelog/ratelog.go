// Package ratelog bounds how often a kind of log line is written, for
// events a hostile or broken peer can cause at any rate: the first is
// logged, then at most one an interval, each saying how many were not.
package ratelog

import (
	"sync/atomic"
	"time"
)

// Limiter lets one log line through per interval. The zero value lets
// every line through; it is safe for concurrent use.
type Limiter struct {
	every      time.Duration
	next       atomic.Int64 // unix nanoseconds before which lines are suppressed
	suppressed atomic.Int64
}

// New returns a Limiter letting one line through every interval.
func New(every time.Duration) *Limiter { return &Limiter{every: every} }

// Allow reports whether a line may be written now and, when it may, how
// many lines were suppressed since the last one allowed.
func (l *Limiter) Allow() (ok bool, suppressed int64) {
	now := time.Now().UnixNano()
	next := l.next.Load()
	if now < next || !l.next.CompareAndSwap(next, now+int64(l.every)) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}
