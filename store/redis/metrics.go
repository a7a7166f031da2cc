package redis

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/store"
)

// Why a call failed, as prefixd_store_redis_errors_total labels it.
const (
	reasonUnavailable = iota // store.ErrUnavailable: unreachable, timed out, failing over
	reasonNotOwner           // store.ErrNotOwner: another process holds the pod's lease
	reasonCanceled           // the caller's context ended, or had before the call
	reasonInvalid            // refused input
	reasonOther              // anything else: a bug, a server misconfigured
	numReasons
)

var reasonNames = [numReasons]string{"unavailable", "not_owner", "canceled", "invalid", "other"}

func reasonOf(err error) int {
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return reasonUnavailable
	case errors.Is(err, store.ErrNotOwner):
		return reasonNotOwner
	case errors.Is(err, context.Canceled):
		return reasonCanceled
	case errors.Is(err, store.ErrInvalidBatch), errors.Is(err, store.ErrInvalidPod),
		errors.Is(err, store.ErrInvalidTier), errors.Is(err, store.ErrInvalidName):
		return reasonInvalid
	}
	return reasonOther
}

// metrics are a Store's Prometheus metrics, by operation.
type metrics struct {
	seconds   [numOps]prometheus.Observer
	errors    [numOps][numReasons]prometheus.Counter
	collector []prometheus.Collector
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	seconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "prefixd_store_redis_call_seconds",
		Help:    "Time the Redis store took per call, by operation (its _count counts calls), failed calls included.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5},
	}, []string{"op"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_store_redis_errors_total",
		Help: "Calls of the Redis store that failed, by operation and reason: unavailable (unreachable, timed out, failing over), not_owner (another prefixd applies the pod), canceled, invalid (refused input), other.",
	}, []string{"op", "reason"})
	m := &metrics{collector: []prometheus.Collector{seconds, errs}}
	for o := range numOps {
		m.seconds[o] = seconds.WithLabelValues(opNames[o])
		for r := range numReasons {
			m.errors[o][r] = errs.WithLabelValues(opNames[o], reasonNames[r])
		}
	}
	if reg == nil {
		return m, nil
	}
	for i, c := range m.collector {
		if err := reg.Register(c); err != nil {
			for _, r := range m.collector[:i] {
				reg.Unregister(r)
			}
			return nil, fmt.Errorf("redis: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	for _, c := range m.collector {
		reg.Unregister(c)
	}
}
