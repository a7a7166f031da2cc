package ingest

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/promreg"
)

// Replay results of prefixd_replays_total.
const (
	// ReplayOK: the replay delivered every missing batch.
	ReplayOK = "ok"
	// ReplayIncomplete: the replay ended normally but lacked some of the
	// missing batches (the publisher's buffer no longer held them).
	ReplayIncomplete = "incomplete"
	// ReplayError: the replay request failed.
	ReplayError = "error"
	// ReplayUnavailable: no replay endpoint is known for the pod.
	ReplayUnavailable = "unavailable"
)

// Reasons of prefixd_ingest_dropped_total written by this package, besides
// the indexer's refusals (indexer.RefuseInvalidPod and the others), which
// are counted under their own names.
const (
	// DropSourceRemoved: a message of a source removed by RemoveSource and
	// not set again.
	DropSourceRemoved = "source_removed"
	// DropForeignTopic: a publisher that connected to a bound address sent
	// a topic naming a pod at another address (Options.TrustTopics).
	DropForeignTopic = "foreign_topic"
	// DropPanic: handling the message panicked (a bug, logged with its
	// stack and counted in prefixd_panics_total).
	DropPanic = "panic"
	// DropError: the store failed while the message's pod was admitted.
	DropError = "error"
	// DropStoreUnavailable: a shared store could not be reached; the
	// message's pod is stale until the store is back and the pod's gap
	// is repaired from replay.
	DropStoreUnavailable = "store_unavailable"
)

// Reasons of prefixd_pods_removed_total.
const (
	// RemovedTimeout: the pod's connection closed and did not come back
	// within Options.PodTimeout.
	RemovedTimeout = "timeout"
	// RemovedSource: the pod's source left the fleet (RemoveSource).
	RemovedSource = "source_removed"
)

// Metrics are the pipeline's Prometheus metrics.
//
// prefixd_ingest_dropped_total{reason,source} is shared with the
// transport package's subscriber: whichever registers it first, the other
// reuses its collector.
type Metrics struct {
	dropped      *prometheus.CounterVec // reason, source
	decodeErrors *prometheus.CounterVec // source
	resets       *prometheus.CounterVec // pod
	gaps         *prometheus.CounterVec // pod
	replays      *prometheus.CounterVec // pod, result
	applyErrors  *prometheus.CounterVec // pod
	podsRemoved  *prometheus.CounterVec // reason
	batches      prometheus.Counter
	duplicates   prometheus.Counter
	notOwner     prometheus.Counter
	lag          prometheus.Histogram
}

// NewMetrics builds the metrics and registers them with reg, which may be
// nil (tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_ingest_dropped_total",
			Help: "Messages dropped on ingest, by reason and source.", // as the transport package's
		}, []string{"reason", "source"}),
		decodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_decode_errors_total",
			Help: "Messages dropped because they did not decode as KV event batches, by source.",
		}, []string{"source"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_resets_total",
			Help: "Pods reset because their seq went backwards (the engine restarted), by pod.",
		}, []string{"pod"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_gaps_total",
			Help: "Seq gaps (and subscriber resyncs) seen, by pod.",
		}, []string{"pod"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_replays_total",
			Help: "Gap repairs, by pod and result (ok, incomplete, error, unavailable).",
		}, []string{"pod", "result"}),
		applyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_apply_errors_total",
			Help: "Batches the indexer failed to apply (then applied again from the store's applied seq), by pod.",
		}, []string{"pod"}),
		podsRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_pods_removed_total",
			Help: "Pods that left the index with their blocks and series, by reason (timeout, source_removed).",
		}, []string{"reason"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixd_batches_duplicate_total",
			Help: "Batches not applied because their pod's applied seq was at or past theirs (replays overlapping, repeated messages).",
		}),
		notOwner: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixd_batches_not_owner_total",
			Help: "Batches left to another prefixd replica sharing the store, which holds the pod's write lease and applies its stream.",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixd_batches_applied_total",
			Help: "Batches applied to the index, live and replayed.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prefixd_apply_lag_seconds",
			Help:    "Time from a batch's publisher timestamp to its application.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.decodeErrors, m.resets, m.gaps, m.replays, m.applyErrors, m.podsRemoved, m.batches, m.duplicates, m.notOwner, m.lag)
		m.dropped = promreg.Register(reg, m.dropped)
	}
	return m
}

// forgetPod deletes the series of a pod that left the fleet.
func (m *Metrics) forgetPod(pod string) {
	m.resets.DeleteLabelValues(pod)
	m.gaps.DeleteLabelValues(pod)
	m.applyErrors.DeleteLabelValues(pod)
	for _, result := range [...]string{ReplayOK, ReplayIncomplete, ReplayError, ReplayUnavailable} {
		m.replays.DeleteLabelValues(pod, result)
	}
}
