package harness

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// Recreatable is an object a benchmark deletes again and again, waiting each time for its replacement.
type Recreatable struct {
	// Current returns the UID of the object now, and the resource version to watch from.
	Current func(ctx context.Context) (types.UID, string, error)
	// Watch watches the object's resource from a resource version.
	Watch func(ctx context.Context, resourceVersion string) (watch.Interface, error)
	// Delete deletes the current object.
	Delete func(ctx context.Context) error
	// Name, when set, is the name the replacement must have.
	Name string
}

// MeasureRecreations deletes the object n times and times each deletion until a watch shows a replacement
// (another UID) being added.
func MeasureRecreations(b testing.TB, n int, r Recreatable) []time.Duration {
	b.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		var before types.UID
		var rv string
		Eventually(b, 30*time.Second, "the object to exist", func(ctx context.Context) (bool, error) {
			var err error
			before, rv, err = r.Current(ctx)
			return err == nil, err
		})
		w, err := r.Watch(ctx, rv)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := r.Delete(ctx); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					b.Fatalf("deletion %d: watch closed", i)
				}
				obj, isObj := ev.Object.(metav1.Object)
				if ev.Type == watch.Added && isObj && obj.GetUID() != before && (r.Name == "" || obj.GetName() == r.Name) {
					lat = append(lat, time.Since(start))
					break wait
				}
			case <-timeout:
				b.Fatalf("deletion %d: no replacement within 30s", i)
			}
		}
		w.Stop()
	}
	return lat
}

// Percentile is the p-th percentile (nearest rank).
func Percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := (len(s)*p+99)/100 - 1
	return s[max(idx, 0)]
}

// ReportComparison prints p50/p99 of Lifeline's measurement beside the anchor's, with the ratios, and reports
// them as benchmark metrics.
func ReportComparison(b *testing.B, title, subject string, got []time.Duration, anchor string, base []time.Duration) {
	gp50, gp99 := Percentile(got, 50), Percentile(got, 99)
	ap50, ap99 := Percentile(base, 50), Percentile(base, 99)
	b.ReportMetric(float64(gp50.Microseconds())/1000, "lifeline-p50-ms")
	b.ReportMetric(float64(gp99.Microseconds())/1000, "lifeline-p99-ms")
	b.ReportMetric(float64(ap50.Microseconds())/1000, "anchor-p50-ms")
	b.ReportMetric(float64(ap99.Microseconds())/1000, "anchor-p99-ms")
	fmt.Printf("\n%s (%d and %d samples)\n", title, len(got), len(base))
	fmt.Printf("  %-48s p50 %10v  p99 %10v\n", "Lifeline: "+subject, gp50.Round(time.Microsecond), gp99.Round(time.Microsecond))
	fmt.Printf("  %-48s p50 %10v  p99 %10v\n", "anchor: "+anchor, ap50.Round(time.Microsecond), ap99.Round(time.Microsecond))
	fmt.Printf("  ratio Lifeline/anchor: p50 %.2fx  p99 %.2fx\n", ratio(gp50, ap50), ratio(gp99, ap99))
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
