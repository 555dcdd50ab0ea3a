package workload

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

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

// recordedEvent is one Event as a recorder received it.
type recordedEvent struct {
	regarding, related                   runtime.Object
	eventType, reason, action, formatted string
}

// recorder keeps the Events it is given.
type recorder struct{ events []recordedEvent }

func (r *recorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	r.events = append(r.events, recordedEvent{regarding, related, eventType, reason, action, fmt.Sprintf(note, args...)})
}

// TestEventfHandsEveryFieldToTheRecorder: both controllers' Events carry the workload, the related object, the
// reason and the action they are given; a controller built without a recorder records nothing, and does not panic.
func TestEventfHandsEveryFieldToTheRecorder(t *testing.T) {
	job := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Name: "job"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-trainworker-0"}}
	cases := []struct {
		name    string
		related runtime.Object
		want    recordedEvent
	}{
		{"with a related object", pod, recordedEvent{job, pod, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod job-trainworker-0"}},
		{"without", nil, recordedEvent{job, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod job-trainworker-0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			d := &Deps{Recorder: rec}
			d.Eventf(job, tc.related, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod %s", pod.Name)
			if diff := cmp.Diff([]recordedEvent{tc.want}, rec.events, cmp.AllowUnexported(recordedEvent{})); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			(&Deps{}).Eventf(job, tc.related, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod %s", pod.Name)
		})
	}
}

// TestEventCreatedTellsOfAPassInOneEvent: what one pass created is one Event, its children named by kind in a
// stable order, related to the child only when there is one; a pass that created nothing records nothing.
func TestEventCreatedTellsOfAPassInOneEvent(t *testing.T) {
	job := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Name: "job"}}
	pod := func(name string) *corev1.Pod { return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	service := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "job-fl"}}
	event := func(related runtime.Object, note string) []recordedEvent {
		return []recordedEvent{{job, related, corev1.EventTypeNormal, ReasonSuccessfulCreate, "Create", note}}
	}
	cases := []struct {
		name    string
		created []CreatedChild
		want    []recordedEvent
	}{
		{"nothing", nil, nil},
		{"one", []CreatedChild{{"Pod", pod("job-trainworker-1")}}, event(pod("job-trainworker-1"), "Created Pod job-trainworker-1")},
		{"a job's start", []CreatedChild{{"Pod", pod("job-trainworker-1")}, {"Pod", pod("job-aggregationworker-0")}, {"Service", service}},
			event(nil, "Created Pod job-aggregationworker-0, Pod job-trainworker-1, Service job-fl")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			(&Deps{Recorder: rec}).EventCreated(job, "Create", tc.created)
			if diff := cmp.Diff(tc.want, rec.events, cmp.AllowUnexported(recordedEvent{})); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
