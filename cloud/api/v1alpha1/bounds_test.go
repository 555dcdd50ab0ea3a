package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// TestBoundMetricsKeepsAFloodedStatusWritable: workers choose their report keys and values; a worker that
// reports thousands of keys, huge values or absurd keys must not grow the status past what the API server
// stores, or the status could never be written again.
func TestBoundMetricsKeepsAFloodedStatusWritable(t *testing.T) {
	cases := []struct {
		name     string
		in       []v1alpha1.Metric
		wantKeys []string // nil: check only the bounds
	}{{
		name:     "a few honest metrics pass unchanged",
		in:       []v1alpha1.Metric{{Key: "hardExampleNumber", Value: "3"}, {Key: "inferenceNumber", Value: "120"}},
		wantKeys: []string{"hardExampleNumber", "inferenceNumber"},
	}, {
		name: "thousands of keys with megabytes of values",
		in: func() []v1alpha1.Metric {
			var ms []v1alpha1.Metric
			for i := range 10000 {
				ms = append(ms, v1alpha1.Metric{Key: fmt.Sprintf("k%05d", i), Value: strings.Repeat("x", 10000)})
			}
			return ms
		}(),
	}, {
		name: "an absurd key and an empty one are dropped",
		in: []v1alpha1.Metric{{Key: "", Value: "1"}, {Key: "accuracy", Value: "0.9"},
			{Key: strings.Repeat("k", v1alpha1.MaxMetricKeyLength+1), Value: "1"}},
		wantKeys: []string{"accuracy"},
	}, {
		name:     "a long value is cut on a character boundary",
		in:       []v1alpha1.Metric{{Key: "label", Value: strings.Repeat("é", v1alpha1.MaxMetricValueLength)}},
		wantKeys: []string{"label"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := v1alpha1.BoundMetrics(tc.in)
			if len(got) > v1alpha1.MaxStatusMetrics {
				t.Errorf("%d metrics kept, at most %d", len(got), v1alpha1.MaxStatusMetrics)
			}
			size := 0
			for i, m := range got {
				size += len(m.Key) + len(m.Value)
				if m.Key == "" || len(m.Key) > v1alpha1.MaxMetricKeyLength || len(m.Value) > v1alpha1.MaxMetricValueLength || !utf8.ValidString(m.Value) {
					t.Errorf("metric %q (%d bytes of value) is out of bounds or cut mid-character", m.Key, len(m.Value))
				}
				if i > 0 && got[i-1].Key >= m.Key {
					t.Errorf("metrics not in key order: %q before %q", got[i-1].Key, m.Key)
				}
			}
			if max := v1alpha1.MaxStatusMetrics * (v1alpha1.MaxMetricKeyLength + v1alpha1.MaxMetricValueLength); size > max {
				t.Errorf("%d bytes of metrics, at most %d", size, max)
			}
			if tc.wantKeys != nil {
				var keys []string
				for _, m := range got {
					keys = append(keys, m.Key)
				}
				if strings.Join(keys, ",") != strings.Join(tc.wantKeys, ",") {
					t.Errorf("keys %v, want %v", keys, tc.wantKeys)
				}
			}
		})
	}
}
