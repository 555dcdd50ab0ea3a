package workload

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// TestUnchangedIsWhatTheAPIServerWouldStore: a status computed with times of the pass (nanoseconds) is unchanged
// from the stored one (whole seconds) when it would store the same bytes, and changed when any field differs.
func TestUnchangedIsWhatTheAPIServerWouldStore(t *testing.T) {
	seen := time.Date(2026, 12, 4, 19, 50, 41, 0, time.UTC)
	stored := func() v1alpha1.JointInferenceServiceStatus {
		at := metav1.NewTime(seen)
		return v1alpha1.JointInferenceServiceStatus{Active: 2, Workers: []v1alpha1.WorkerStatus{{
			Name: "edge", Liveness: v1alpha1.LivenessAlive, Source: v1alpha1.StatusSourceAgent, LastSeen: &at}}}
	}
	cases := []struct {
		name      string
		edit      func(*v1alpha1.JointInferenceServiceStatus)
		unchanged bool
	}{
		{"the same", func(*v1alpha1.JointInferenceServiceStatus) {}, true},
		{"a time of the pass within the stored second", func(s *v1alpha1.JointInferenceServiceStatus) {
			at := metav1.NewTime(seen.Add(734 * time.Millisecond))
			s.Workers[0].LastSeen = &at
		}, true},
		{"a time a second later", func(s *v1alpha1.JointInferenceServiceStatus) {
			at := metav1.NewTime(seen.Add(time.Second))
			s.Workers[0].LastSeen = &at
		}, false},
		{"another source", func(s *v1alpha1.JointInferenceServiceStatus) { s.Workers[0].Source = v1alpha1.StatusSourceAPIServer }, false},
		{"a counter back to zero", func(s *v1alpha1.JointInferenceServiceStatus) { s.Active = 0 }, false},
		{"a worker more", func(s *v1alpha1.JointInferenceServiceStatus) {
			s.Workers = append(s.Workers, v1alpha1.WorkerStatus{Name: "cloud"})
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			computed := stored()
			tc.edit(&computed)
			if got := Unchanged(computed, stored()); got != tc.unchanged {
				t.Errorf("Unchanged = %v, want %v", got, tc.unchanged)
			}
		})
	}
}
