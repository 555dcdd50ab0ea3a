package nodewatch

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

func node(ready corev1.ConditionStatus, heartbeat time.Time) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge1"}}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.NewTime(heartbeat)}}
	}
	return n
}

// TestOnlyReadinessChangesWakeWorkloads: a Node back from a cut (Unknown or False to True), or one that stops
// being Ready, wakes its workloads; a heartbeat, which only renews the condition's times, does not.
func TestOnlyReadinessChangesWakeWorkloads(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name     string
		old, new *corev1.Node
		want     bool
	}{
		{"heartbeat", node(corev1.ConditionTrue, t0), node(corev1.ConditionTrue, t0.Add(10*time.Second)), false},
		{"heartbeat of a node not ready", node(corev1.ConditionFalse, t0), node(corev1.ConditionFalse, t0.Add(time.Second)), false},
		{"reconnect from Unknown", node(corev1.ConditionUnknown, t0), node(corev1.ConditionTrue, t0), true},
		{"reconnect from False", node(corev1.ConditionFalse, t0), node(corev1.ConditionTrue, t0), true},
		{"lost", node(corev1.ConditionTrue, t0), node(corev1.ConditionUnknown, t0), true},
		{"first condition posted", node("", t0), node(corev1.ConditionTrue, t0), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReadinessChanged.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
				t.Errorf("wakes = %v, want %v", got, tc.want)
			}
		})
	}
	if !ReadinessChanged.Create(event.CreateEvent{Object: node(corev1.ConditionTrue, t0)}) ||
		!ReadinessChanged.Delete(event.DeleteEvent{Object: node(corev1.ConditionTrue, t0)}) {
		t.Error("a Node's creation and deletion must wake its workloads")
	}
}
