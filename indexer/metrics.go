package indexer

import "github.com/prometheus/client_golang/prometheus"

// Drop reasons: why blocks of an event were not applied.
const (
	dropUnknownParent = "unknown_parent" // tokens mode: parent's key unknown, chain cannot continue
	dropUnknownHash   = "unknown_hash"   // removal or tier change of a block the pod does not hold
	dropBlockSize     = "block_size"     // event block size differs from the model's
	dropTokenCount    = "token_count"    // token_ids do not cover the listed blocks
	dropUnknownEvent  = "unknown_event"  // event type prefixd does not know
)

// Metrics are the indexer's Prometheus metrics.
type Metrics struct {
	events     *prometheus.CounterVec // by type, pod
	dropped    *prometheus.CounterVec // blocks, by reason
	hashChecks *prometheus.CounterVec // by model, result
	mismatches *prometheus.CounterVec // by model, reason
	keyMode    *prometheus.GaugeVec   // by model, mode
	clears     *prometheus.CounterVec // by reason
	stale      *prometheus.GaugeVec   // by pod
	refused    *prometheus.CounterVec // batches, by reason
	// lorasUnlearned counts adapter names not learned: MaxLoRAs were known.
	lorasUnlearned prometheus.Counter

	blockSize     *prometheus.GaugeVec   // by model
	podBlockSize  *prometheus.GaugeVec   // by pod
	storedBlocks  *prometheus.CounterVec // by pod, kind, outcome
	skipped       *prometheus.CounterVec // blocks, by reason
	groups        *prometheus.GaugeVec   // by pod, kind
	unknownMedia  prometheus.Counter
	skippedTypes  *prometheus.CounterVec // events, by type
	skippedFields *prometheus.CounterVec // fields, by name
}

// NewMetrics builds the metrics and registers them with reg, which may be nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_events_total",
			Help: "KV cache events applied, by type and pod.",
		}, []string{"type", "pod"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_blocks_dropped_total",
			Help: "Blocks of events that could not be applied, by reason.",
		}, []string{"reason"}),
		hashChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_hash_checks_total",
			Help: "BlockStored events re-chained from parent and tokens and compared with the engine's hashes, by model and result (match, mismatch, non_contiguous: blocks that do not continue their parent, which llm-d-inference-sim sends and engine key mode indexes exactly).",
		}, []string{"model", "result"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_hash_mismatches_total",
			Help: "BlockStored events whose engine hashes prefixd could not reproduce, by model and likely reason.",
		}, []string{"model", "reason"}),
		keyMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixd_key_mode",
			Help: "1 for the key mode each model uses (engine, tokens, or auto while undecided).",
		}, []string{"model", "mode"}),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixd_pod_clears_total",
			Help: "Times every block of a pod was dropped, by reason (all_blocks_cleared, reset, removed).",
		}, []string{"reason"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixd_pod_stale",
			Help: "1 while a pod's events are known to be incomplete (a gap replay could not fill), 0 once consistent.",
		}, []string{"pod"}),
	}
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_batches_refused_total",
		Help: "Batches refused whole, before any of their events applied, by reason (invalid_pod, invalid_model, invalid_lora, max_pods, max_models).",
	}, []string{"reason"})
	m.lorasUnlearned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "prefixd_loras_unlearned_total",
		Help: "LoRA adapter names seen in events and not learned because the adapter limit (--max-loras) was reached.",
	})
	m.blockSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "prefixd_model_block_size",
		Help: "Tokens per block of each model, as its full-attention BlockStored events say (the configured size until one came).",
	}, []string{"model"})
	m.podBlockSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "prefixd_pod_block_size",
		Help: "Tokens per block of each pod's full-attention BlockStored events; a pod whose size differs from its model's cannot be matched.",
	}, []string{"pod"})
	m.storedBlocks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_pod_stored_blocks_total",
		Help: "Blocks of BlockStored events by pod, KV cache group kind (none: no group named) and outcome: indexed, or skipped (a group that is not full attention, another full-attention group, remote storage, a block size other than the model's).",
	}, []string{"pod", "kind", "outcome"})
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_blocks_skipped_total",
		Help: "Blocks of events deliberately not applied, by reason (kind, secondary_group, unknown_group, remote, copies_remain, copy_counts_mismatch).",
	}, []string{"reason"})
	m.groups = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "prefixd_pod_kv_cache_groups",
		Help: "KV cache groups each pod's events named, by kind.",
	}, []string{"pod", "kind"})
	m.unknownMedia = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "prefixd_events_unknown_medium_total",
		Help: "Events on a medium prefixd does not know, indexed on the slowest tier (DISK).",
	})
	m.skippedTypes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_events_skipped_total",
		Help: "Events of types prefixd does not know, skipped, by type name (other past 64 names; invalid for names that are not valid labels).",
	}, []string{"type"})
	m.skippedFields = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixd_event_fields_skipped_total",
		Help: "Fields prefixd does not know, skipped, by name (other past 64 names; invalid for names that are not valid labels).",
	}, []string{"field"})
	if reg != nil {
		reg.MustRegister(m.events, m.dropped, m.hashChecks, m.mismatches, m.keyMode, m.clears, m.stale, m.refused, m.lorasUnlearned,
			m.blockSize, m.podBlockSize, m.storedBlocks, m.skipped, m.groups, m.unknownMedia, m.skippedTypes, m.skippedFields)
	}
	return m
}
