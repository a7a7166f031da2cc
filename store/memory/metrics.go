package memory

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a key an OpAdd named was not stored.
const (
	// dropCapacity: no room could be made: the adder holds nothing in the
	// key's shard to give up and no other pod there is over its limit
	// (or the store has no records left).
	dropCapacity = "capacity"
	dropPods     = "too_many_pods"
)

// reason says whose holding was evicted to make room for an OpAdd.
type reason uint8

const (
	reasonCacheSize reason = iota // a pod holding more than its cache size
	reasonFairShare               // a pod holding more than its fair share
	reasonOwn                     // nobody over: the adder's own
	numReasons
)

var reasonNames = [numReasons]string{"over_cache_size", "over_fair_share", "own"}

// metrics are a Store's Prometheus metrics.
type metrics struct {
	evictions [numReasons]prometheus.Counter
	dropped   *prometheus.CounterVec // keys, by reason
}

func newMetrics(reg prometheus.Registerer, s *Store) (*metrics, error) {
	evictions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_store_evicted_blocks_total",
		Help: "Blocks ((pod, key) pairs) the in-memory index forgot to stay within its capacity, by whose they were: a pod over its cache size or its fair share, or the adder's own.",
	}, []string{"reason"})
	m := &metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_store_dropped_blocks_total",
			Help: "Blocks the in-memory index was asked to add and did not store, by reason.",
		}, []string{"reason"}),
	}
	for why, name := range reasonNames {
		m.evictions[why] = evictions.WithLabelValues(name)
	}
	m.dropped.WithLabelValues(dropCapacity)
	m.dropped.WithLabelValues(dropPods)
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{evictions, m.dropped, newCollector(s)}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, r := range cs[:i] {
				reg.Unregister(r)
			}
			return nil, fmt.Errorf("memory: register metrics: %w", err)
		}
	}
	return m, nil
}

// collector reports the size gauges from one Stats call per scrape, and
// the evictions of each pod that has some (only those, so that a large
// fleet's scrape stays small).
type collector struct {
	s                                  *Store
	blocks, keys, pods, capacity, size *prometheus.Desc
	pairs, podEvicted                  *prometheus.Desc
}

func newCollector(s *Store) *collector {
	return &collector{
		s:        s,
		blocks:   prometheus.NewDesc("prefixd_store_blocks", "(pod, key) pairs held by the in-memory index.", nil, nil),
		keys:     prometheus.NewDesc("prefixd_store_keys", "Distinct block keys held by the in-memory index.", nil, nil),
		pods:     prometheus.NewDesc("prefixd_store_pods", "Pods the in-memory index knows: with blocks, an applied seq or a stale mark.", nil, nil),
		capacity: prometheus.NewDesc("prefixd_store_capacity_blocks", "Most (pod, key) pairs the in-memory index holds.", nil, nil),
		size:     prometheus.NewDesc("prefixd_store_bytes", "Estimated memory of the in-memory index's tables, lists and engine-hash maps.", nil, nil),
		pairs: prometheus.NewDesc("prefixd_store_engine_pairs",
			"Engine hash -> key pairs the in-memory index keeps for pods in tokens key mode, those whose key a pod no longer holds and a sweep has not yet dropped included.", nil, nil),
		podEvicted: prometheus.NewDesc("prefixd_store_pod_evicted_blocks",
			"Blocks of the pod the in-memory index evicted, or could not store, for lack of room since the pod was last cleared or forgotten; its matches are incomplete. Only pods with some are listed.",
			[]string{"pod"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocks
	ch <- c.keys
	ch <- c.pods
	ch <- c.capacity
	ch <- c.size
	ch <- c.pairs
	ch <- c.podEvicted
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(st.Blocks))
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.pods, prometheus.GaugeValue, float64(st.Pods))
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(st.CapacityBlocks))
	ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.pairs, prometheus.GaugeValue, float64(st.EnginePairs))
	c.s.forEachEvicted(func(pod string, n int64) {
		ch <- prometheus.MustNewConstMetric(c.podEvicted, prometheus.GaugeValue, float64(n), pod)
	})
}
