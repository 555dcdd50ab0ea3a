package jointinference

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// observation is what a pass reads: the service's inputs (or why they are missing), its worker Deployments with
// their pods, and the view of each worker.
type observation struct {
	in      inputs
	missing *problem
	workers []workerObservation
	views   map[string]liveness.View
	now     time.Time
}

// workerObservation is one worker Deployment as the cache shows it, with its pods.
type workerObservation struct {
	workerType string
	deployment *appsv1.Deployment // nil when absent
	pods       []corev1.Pod
}

// problem is why the workers cannot be rendered now; it is reported in the Ready condition and retried when
// the missing input appears.
type problem struct {
	reason, message string
}

// observe reads the service's inputs, its two worker Deployments with their pods, and the view of each pod.
func (r *Reconciler) observe(ctx context.Context, ji *v1alpha1.JointInferenceService) (observation, error) {
	obs := observation{now: r.Clock()}
	obs.in, obs.missing = r.readInputs(ctx, ji)
	for _, wt := range []string{workerCloud, workerEdge} {
		w, err := r.observeWorker(ctx, ji, wt)
		if err != nil {
			return obs, err
		}
		obs.workers = append(obs.workers, w)
	}
	obs.views = r.Edge.Views(ctx, obs.pods(), obs.now)
	return obs, nil
}

func (o observation) pods() []*corev1.Pod {
	var pods []*corev1.Pod
	for _, w := range o.workers {
		for i := range w.pods {
			pods = append(pods, &w.pods[i])
		}
	}
	return pods
}

// readInputs reads the Models the service names and the metadata of the Secrets those name.
func (r *Reconciler) readInputs(ctx context.Context, ji *v1alpha1.JointInferenceService) (inputs, *problem) {
	in := inputs{ji: ji, secrets: map[string]*metav1.PartialObjectMetadata{}, lcServer: r.LCServer}
	for _, ref := range []struct {
		name string
		into **v1alpha1.Model
	}{{ji.Spec.EdgeWorker.Model.Name, &in.edgeModel}, {ji.Spec.CloudWorker.Model.Name, &in.cloudModel}} {
		m := &v1alpha1.Model{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: ji.Namespace, Name: ref.name}, m); err != nil {
			return in, &problem{reason: ReasonModelNotFound, message: fmt.Sprintf("Model %s: %v", ref.name, err)}
		}
		*ref.into = m
		if m.Spec.CredentialName == "" {
			continue
		}
		s := contract.SecretMetadata()
		if err := r.Get(ctx, types.NamespacedName{Namespace: ji.Namespace, Name: m.Spec.CredentialName}, s); err != nil {
			return in, &problem{reason: ReasonSecretNotFound,
				message: fmt.Sprintf("Secret %s of Model %s: %v", m.Spec.CredentialName, m.Name, err)}
		}
		in.secrets[s.Name] = s
	}
	return in, nil
}

func (r *Reconciler) observeWorker(ctx context.Context, ji *v1alpha1.JointInferenceService, workerType string) (workerObservation, error) {
	obs := workerObservation{workerType: workerType}
	d := &appsv1.Deployment{}
	// Only read (readiness, ownership): the cache's Deployment, not a copy.
	err := r.Get(ctx, types.NamespacedName{Namespace: ji.Namespace, Name: DeploymentName(ji.Name, workerType)}, d, client.UnsafeDisableDeepCopy)
	if client.IgnoreNotFound(err) != nil {
		return obs, fmt.Errorf("reading %s deployment: %w", workerType, err)
	}
	if err == nil && metav1.IsControlledBy(d, ji) {
		obs.deployment = d
	}
	if sednaTemplate(obs.deployment) {
		pods, err := r.markSednaPods(ctx, ji, workerType)
		obs.pods = pods
		return obs, err
	}
	pods := &corev1.PodList{}
	// Only read (views, commands, the status), never kept or written: copying each pod was a sixth of a pass's
	// CPU.
	if err := r.List(ctx, pods, client.InNamespace(ji.Namespace), client.MatchingFields{workloadIndex: ji.Name},
		client.MatchingLabels(contract.Labels(Kind, ji.Name, ji.UID, workerType)), client.UnsafeDisableDeepCopy); err != nil {
		return obs, fmt.Errorf("listing %s worker pods: %w", workerType, err)
	}
	obs.pods = pods.Items
	return obs, nil
}
