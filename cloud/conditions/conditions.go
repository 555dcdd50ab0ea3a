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

// ReasonUnspecified names the transition of a condition that was stored without a reason of a status other than
// True (Sedna's GM writes conditions without one).
const ReasonUnspecified = "Unspecified"

// Normalize makes conditions stored by another controller — Sedna's GM appends conditions without a reason or a
// transition time, and may repeat a type — valid as metav1.Conditions, so the status that carries them can be
// written back under Lifeline's schema. Only the types keep accepts are kept (nil keeps all); of a repeated type,
// the last, which is the latest GM appended. A missing reason becomes the type for a True condition (Sedna's
// `Complete` is the reason itself) and ReasonUnspecified otherwise; a missing transition time becomes now, once:
// the next pass finds it stored. It reports whether anything changed; conditions Lifeline wrote pass unchanged.
func Normalize(conds []metav1.Condition, keep func(conditionType string) bool, now metav1.Time) ([]metav1.Condition, bool) {
	last := map[string]int{}
	for i, c := range conds {
		last[c.Type] = i
	}
	changed := false
	out := conds[:0:0]
	for i, c := range conds {
		if last[c.Type] != i || (keep != nil && !keep(c.Type)) || c.Type == "" {
			changed = true
			continue
		}
		if c.Status == "" {
			c.Status, changed = metav1.ConditionUnknown, true
		}
		if c.Reason == "" {
			c.Reason, changed = ReasonUnspecified, true
			if c.Status == metav1.ConditionTrue {
				c.Reason = c.Type
			}
		}
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime, changed = now, true
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		out = nil
	}
	return out, changed
}
