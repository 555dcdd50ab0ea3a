package federatedlearning

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// worker is one identity with the pod the cache shows under its name and the record the job's status keeps.
type worker struct {
	id     identity
	pod    *corev1.Pod           // nil: no pod of this job under the name
	record v1alpha1.WorkerStatus // as stored; zero when the status has none yet
	view   liveness.View         // what the node's agent says, when it is the truth
}

// observe pairs each identity with its pod in the cache: the pod of its stable name, or else a pod Sedna's GM
// made that was adopted for it (adopt.go). Pods of an earlier job of the same name (another UID) are not this
// job's. Before the first status of a job that is still running, the pods GM made are looked for and adopted,
// so none of its workers is created twice.
func (r *Reconciler) observe(ctx context.Context, job *v1alpha1.FederatedLearningJob) ([]worker, error) {
	pods := &corev1.PodList{}
	// The cache's pods, not copies: a pass only reads them, but for releasePods, which patches a copy.
	if err := r.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingFields{workloadIndex: nameLabelValue(job.Name)},
		client.MatchingLabels(selectorLabels(job)), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing worker pods: %w", err)
	}
	ids := identities(job)
	byName := map[string]*corev1.Pod{}
	isID := make(map[string]bool, len(ids))
	for _, id := range ids {
		isID[id.name] = true
	}
	var others []*corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		switch {
		case !metav1.IsControlledBy(pod, job):
		case isID[pod.Name]:
			byName[pod.Name] = pod
		default:
			others = append(others, pod)
		}
	}
	for _, pod := range others {
		if name := identityOf(job, pod); name != "" && byName[name] == nil {
			byName[name] = pod
		}
	}
	// A name that has a pod already takes none of GM's: once the first pass made the job's pods, the passes its
	// own creations wake, which may still read the job without its first status, list nothing past the cache.
	free := map[string]bool{}
	for _, id := range ids {
		if byName[id.name] == nil {
			free[id.name] = true
		}
	}
	if len(job.Status.Workers) == 0 && !finished(job.Status) && len(free) > 0 {
		adopted, err := r.adoptSednaPods(ctx, job, free)
		if err != nil {
			return nil, err
		}
		for name, pod := range adopted {
			byName[name] = pod
		}
	}
	records := map[string]v1alpha1.WorkerStatus{}
	for _, w := range job.Status.Workers {
		records[w.Name] = w
	}
	workers := make([]worker, 0, len(ids))
	for _, id := range ids {
		workers = append(workers, worker{id: id, pod: byName[id.name], record: records[id.name]})
	}
	views := r.Edge.Views(ctx, podsOf(workers), r.Clock())
	for i := range workers {
		if workers[i].pod != nil {
			workers[i].view = views[workers[i].pod.Name]
		}
	}
	return workers, nil
}

func podsOf(workers []worker) []*corev1.Pod {
	pods := make([]*corev1.Pod, 0, len(workers))
	for _, w := range workers {
		if w.pod != nil {
			pods = append(pods, w.pod)
		}
	}
	return pods
}
