package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRegisterShares(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "prefixd_test_total", Help: "A test counter."}
	a := Register(reg, prometheus.NewCounterVec(opts, []string{"reason"}))
	b := Register(reg, prometheus.NewCounterVec(opts, []string{"reason"}))
	if a != b {
		t.Fatal("a second registration did not return the first collector")
	}
	b.WithLabelValues("x").Inc()
	if got := testutil.ToFloat64(a.WithLabelValues("x")); got != 1 {
		t.Fatalf("shared counter = %v, want 1", got)
	}
}

func TestRegisterConflictPanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_test_total", Help: "A test counter."}))
	defer func() {
		if recover() == nil {
			t.Fatal("registering another kind under the same name did not panic")
		}
	}()
	Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixd_test_total", Help: "A gauge."}))
}
