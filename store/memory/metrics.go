package memory

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a key given to Add was not stored.
const (
	dropCapacity = "capacity" // no room could be made: the key's own holders fill its shard
	dropPods     = "too_many_pods"
)

// metrics are a Store's Prometheus metrics.
type metrics struct {
	evictions prometheus.Counter
	dropped   *prometheus.CounterVec // keys, by reason
}

func newMetrics(reg prometheus.Registerer, s *Store) (*metrics, error) {
	m := &metrics{
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixd_store_evicted_blocks_total",
			Help: "Blocks ((pod, key) pairs) the in-memory index forgot to stay within its capacity.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_store_dropped_blocks_total",
			Help: "Blocks the in-memory index was asked to add and did not store, by reason.",
		}, []string{"reason"}),
	}
	m.dropped.WithLabelValues(dropCapacity)
	m.dropped.WithLabelValues(dropPods)
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.evictions, m.dropped, newCollector(s)}
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

// collector reports the size gauges from one Stats call per scrape.
type collector struct {
	s                                  *Store
	blocks, keys, pods, capacity, size *prometheus.Desc
}

func newCollector(s *Store) *collector {
	return &collector{
		s:        s,
		blocks:   prometheus.NewDesc("prefixd_store_blocks", "(pod, key) pairs held by the in-memory index.", nil, nil),
		keys:     prometheus.NewDesc("prefixd_store_keys", "Distinct block keys held by the in-memory index.", nil, nil),
		pods:     prometheus.NewDesc("prefixd_store_pods", "Pods with an id in the in-memory index.", nil, nil),
		capacity: prometheus.NewDesc("prefixd_store_capacity_blocks", "Most (pod, key) pairs the in-memory index holds.", nil, nil),
		size:     prometheus.NewDesc("prefixd_store_bytes", "Estimated memory of the in-memory index's tables and lists.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocks
	ch <- c.keys
	ch <- c.pods
	ch <- c.capacity
	ch <- c.size
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(st.Blocks))
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.pods, prometheus.GaugeValue, float64(st.Pods))
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(st.CapacityBlocks))
	ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(st.Bytes))
}
