package contract

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IndexWorkloadPods is the function of a pod index by the workload of kind whose Sedna name label the pod
// carries, so a pass reads its own workload's pods without going through every pod of the namespace: at a
// thousand workloads a namespace holds thousands of pods, and a label-selected list walks them all.
func IndexWorkloadPods(kind string) client.IndexerFunc {
	label := LabelPrefix(kind) + "name"
	return func(o client.Object) []string {
		if name, ok := o.GetLabels()[label]; ok {
			return []string{name}
		}
		return nil
	}
}
