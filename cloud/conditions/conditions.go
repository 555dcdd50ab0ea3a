// Package conditions sets metav1.Conditions the way every Lifeline status does: the transition time moves only
// when the status changes, so an unchanged world writes nothing.
package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Set puts c into conds, keeping the old transition time when the status is the same.
func Set(conds *[]metav1.Condition, c metav1.Condition, now metav1.Time) {
	c.LastTransitionTime = now
	if old := meta.FindStatusCondition(*conds, c.Type); old != nil && old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	meta.SetStatusCondition(conds, c)
}

// IsTrue tells whether condition t is present and True.
func IsTrue(conds []metav1.Condition, t string) bool {
	return meta.IsStatusConditionTrue(conds, t)
}
