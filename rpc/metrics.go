package rpc

import "github.com/prometheus/client_golang/prometheus"

// Methods as they appear in the method label.
const (
	methodMatch     = "Match"
	methodScore     = "Score"
	methodPods      = "Pods"
	methodStats     = "Stats"
	methodHTTPMatch = "http_match"
	methodHTTPScore = "http_score"
	methodHTTPPods  = "http_pods"
	methodHTTPStats = "http_stats"
)

// Query results as they appear in the result label.
const (
	resultHit      = "hit"      // at least one pod matched a block
	resultMiss     = "miss"     // no pod matched
	resultError    = "error"    // answered with an error
	resultRejected = "rejected" // refused by a limit (prefixd_query_refused_total says which)
	resultOK       = "ok"       // answered, by a method that matches nothing (Pods, Stats)
)

var (
	allMethods = []string{methodMatch, methodScore, methodPods, methodStats, methodHTTPMatch, methodHTTPScore, methodHTTPPods, methodHTTPStats}
	allResults = []string{resultHit, resultMiss, resultError, resultRejected, resultOK}
)

// Metrics are the query server's Prometheus metrics.
type Metrics struct {
	duration *prometheus.HistogramVec // by method
	queries  *prometheus.CounterVec   // by method, result
	refused  *prometheus.CounterVec   // by reason

	// Children resolved once: a label lookup per query costs a hash and a
	// lock in the vector.
	observers map[string]prometheus.Observer
	counters  map[[2]string]prometheus.Counter
	refusals  map[string]prometheus.Counter
}

// NewMetrics builds the metrics and registers them with reg, which may be nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixd_query_duration_seconds",
			Help:    "Time to answer a query, by method (gRPC methods, http_match, http_score, http_pods, http_stats).",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}, []string{"method"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_queries_total",
			Help: "Queries answered, by method and result: hit (some pod matched), miss (none did), ok (Pods, Stats), error, rejected (refused by a limit, see prefixd_query_refused_total). Hit ratio = hit / (hit + miss).",
		}, []string{"method", "result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_query_refused_total",
			Help: "Queries refused by a limit, gRPC and HTTP together, by reason: concurrency (--query-max-concurrent), memory (--query-max-inflight-bytes), too_large (--query-max-message-bytes), tokens (--query-max-tokens), block_hashes (--query-max-block-hashes).",
		}, []string{"reason"}),
		observers: make(map[string]prometheus.Observer),
		counters:  make(map[[2]string]prometheus.Counter),
		refusals:  make(map[string]prometheus.Counter),
	}
	for _, method := range allMethods {
		m.observers[method] = m.duration.WithLabelValues(method)
		for _, r := range allResults {
			m.counters[[2]string{method, r}] = m.queries.WithLabelValues(method, r)
		}
	}
	for _, r := range allReasons {
		m.refusals[r] = m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.duration, m.queries, m.refused)
	}
	return m
}

func (m *Metrics) observe(method, result string, seconds float64) {
	m.observers[method].Observe(seconds)
	m.counters[[2]string{method, result}].Inc()
}
