package federatedlearning

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// ReasonAdopted is the Event reason of a worker pod Sedna's GM made that Lifeline takes over.
const ReasonAdopted = "Adopted"

// sednaCandidates are the pods of a job that Sedna's GM made: controlled by the job (same UID) but without
// Lifeline's role label, which every pod Lifeline renders carries.
func sednaCandidates(job *v1alpha1.FederatedLearningJob, pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if _, ours := p.Labels[contract.RoleLabel]; ours || !metav1.IsControlledBy(p, job) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// matchSednaPods tells which identity each pod Sedna's GM made stands for, for the identities free holds (those
// without a pod of their own). GM names pods `<job>-<aggregation|train>-<random>` and gives them a random
// WORKER_NAME, so the identity comes from what GM wrote that Lifeline can read back: the worker-type label (the
// aggregator), and for a trainer the DATASET_NAME it was given, with the node it was placed on to tell apart
// trainers of the same Dataset, in spec order. Of several pods for one identity (GM re-created a deleted pod),
// one that is still active wins, then the newest. A pod that matches nothing is left alone.
func matchSednaPods(job *v1alpha1.FederatedLearningJob, free map[string]bool, pods []*corev1.Pod) map[string]*corev1.Pod {
	sorted := append([]*corev1.Pod(nil), pods...)
	rank := func(p *corev1.Pod) int {
		switch {
		case p.DeletionTimestamp != nil:
			return 2
		case isTerminal(p):
			return 1
		}
		return 0
	}
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	typeLabel := contract.LabelPrefix(Kind) + "worker-type"
	out := map[string]*corev1.Pod{}
	for _, p := range sorted {
		switch p.Labels[typeLabel] {
		case workerTypeAggregation:
			if name := AggregatorName(job.Name); free[name] && out[name] == nil {
				out[name] = p
			}
		case workerTypeTraining: // Sedna's GM and Lifeline write the same worker types
			if i := trainerIndex(job, p, func(i int) bool { n := TrainerName(job.Name, i); return free[n] && out[n] == nil }); i >= 0 {
				out[TrainerName(job.Name, i)] = p
			}
		}
	}
	return out
}

// trainerIndex is the index in spec.trainingWorkers of the free trainer a pod GM made stands for, or -1: one whose
// Dataset is the pod's DATASET_NAME, on the pod's node if one is, else the first.
func trainerIndex(job *v1alpha1.FederatedLearningJob, pod *corev1.Pod, free func(int) bool) int {
	dataset := envOf(pod, contract.EnvDatasetName)
	first := -1
	for i, tw := range job.Spec.TrainingWorkers {
		if tw.Dataset.Name != dataset || !free(i) {
			continue
		}
		if node := tw.Template.Spec.NodeName; node != "" && node == pod.Spec.NodeName {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return first
}

func envOf(pod *corev1.Pod, name string) string {
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// identityOf tells which identity an adopted pod stands for from the marks adoption put on it: the role, and a
// trainer's index. It returns "" for a pod that carries neither.
func identityOf(job *v1alpha1.FederatedLearningJob, pod *corev1.Pod) string {
	switch v1alpha1.WorkerRole(pod.Labels[contract.RoleLabel]) {
	case v1alpha1.WorkerRoleAggregator:
		return AggregatorName(job.Name)
	case v1alpha1.WorkerRoleTrainer:
		i, err := strconv.Atoi(pod.Labels[IndexLabel])
		if err != nil || i < 0 || i >= len(job.Spec.TrainingWorkers) {
			return ""
		}
		return TrainerName(job.Name, i)
	}
	return ""
}

// adoptSednaPods takes over the pods Sedna's GM made for the identities free holds: it marks each with Lifeline's
// role (and a trainer's index) and the accounting finalizer, so it enters the controller's cache and the edge
// agent's view, and is counted as it ends, like a pod Lifeline made. They run on, untouched otherwise, to
// completion; one that fails is rebuilt under Lifeline's stable name. The pods are read from the API server: the
// cache holds only pods already marked.
func (r *Reconciler) adoptSednaPods(ctx context.Context, job *v1alpha1.FederatedLearningJob, free map[string]bool) (map[string]*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Uncached().List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels(selectorLabels(job))); err != nil {
		return nil, fmt.Errorf("listing pods Sedna made: %w", err)
	}
	candidates := sednaCandidates(job, pods.Items)
	if len(candidates) == 0 {
		return nil, nil
	}
	matched := matchSednaPods(job, free, candidates)
	adopted := map[string]*corev1.Pod{}
	for name, pod := range matched {
		role := v1alpha1.WorkerRoleAggregator
		patched := pod.DeepCopy()
		for i := range job.Spec.TrainingWorkers {
			if TrainerName(job.Name, i) == name {
				role = v1alpha1.WorkerRoleTrainer
				patched.Labels[IndexLabel] = strconv.Itoa(i)
			}
		}
		patched.Labels[contract.RoleLabel] = string(role)
		if pod.DeletionTimestamp == nil && !hasFinalizer(pod) {
			patched.Finalizers = append(patched.Finalizers, WorkerFinalizer)
		}
		err := r.Patch(ctx, patched, client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{}))
		if client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("adopting pod %s as %s: %w", pod.Name, name, err)
		}
		if err != nil {
			continue
		}
		log.FromContext(ctx).V(2).Info("adopted worker pod", "pod", pod.Name, "identity", name)
		r.Eventf(job, patched, corev1.EventTypeNormal, ReasonAdopted, ReasonAdopted, "Adopted pod %s as worker %s", pod.Name, name)
		adopted[name] = patched
	}
	return adopted, nil
}
