package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestANewerCollectorReplacesTheOneRegisteredUnderItsName(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	gauge := func(v float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return v })
	}
	if err := Register(reg, gauge(1)); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg, gauge(2)); err != nil {
		t.Fatalf("a second instance was refused: %v", err)
	}
	if got := testutil.ToFloat64(mustGather(t, reg)); got != 2 {
		t.Fatalf("scraped %v, want the newer instance's 2", got)
	}
	clash := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "another help"}, func() float64 { return 3 })
	if err := Register(reg, clash); err == nil {
		t.Fatal("a collector of the same name and other help was registered")
	}
}

func mustGather(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil || len(families) != 1 {
		t.Fatalf("gathered %d families: %v", len(families), err)
	}
	v := families[0].GetMetric()[0].GetGauge().GetValue()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "y", Help: "y"}, func() float64 { return v })
}
