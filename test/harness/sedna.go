package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// The helpers below make a workload's children exactly as Sedna's GlobalManager (kubeedge/sedna main,
// pkg/globalmanager) writes them, so tests start from the cluster a Sedna user hands over to Lifeline. Each
// cites the GM behaviour it reproduces.

// sednaLabels are GM's runtime.generateLabels: `<kind>.sedna.io/{name,uid,worker-type}`, the worker type
// lower-cased.
func sednaLabels(kind string, obj metav1.Object, workerType string) map[string]string {
	prefix := strings.ToLower(kind) + ".sedna.io/"
	l := map[string]string{prefix + "name": obj.GetName(), prefix + "uid": string(obj.GetUID())}
	if workerType != "" {
		l[prefix+"worker-type"] = strings.ToLower(workerType)
	}
	return l
}

func sednaEnv(env map[string]string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for k, v := range env {
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	return out
}

// sednaPod is GM's runtime.CreatePodWithTemplate: the template's labels plus GM's, GenerateName
// `<cr>-<worker type>-`, a controller owner reference, GM's env appended to every container, hostNetwork when
// forced, restartPolicy OnFailure unless the template sets one.
func sednaPod(kind string, owner client.Object, gvkKind string, tmpl corev1.PodTemplateSpec, workerType string,
	env map[string]string, hostNetwork bool) *corev1.Pod {
	t := tmpl.DeepCopy()
	labels := map[string]string{}
	for k, v := range t.Labels {
		labels[k] = v
	}
	for k, v := range sednaLabels(kind, owner, workerType) {
		labels[k] = v
	}
	for i := range t.Spec.Containers {
		t.Spec.Containers[i].Env = append(t.Spec.Containers[i].Env, sednaEnv(env)...)
	}
	if hostNetwork {
		t.Spec.HostNetwork = true
	}
	if t.Spec.RestartPolicy == "" {
		t.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    owner.GetName() + "-" + strings.ToLower(workerType) + "-",
			Namespace:       owner.GetNamespace(),
			Labels:          labels,
			Annotations:     t.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owner, v1alpha1.GroupVersion.WithKind(gvkKind))},
		},
		Spec: t.Spec,
	}
}

// SednaFLChildren are what GM made for a FederatedLearningJob.
type SednaFLChildren struct {
	Aggregator *corev1.Pod
	Trainers   []*corev1.Pod // in spec.trainingWorkers order
	Service    *corev1.Service
}

// CreateSednaFLChildren creates, through the API, the children GM's federatedlearning controller makes for a
// job (createAggPod, createService, createTrainPod): an aggregator pod `<job>-aggregation-<random>` with
// WORKER_NAME `aggworker-<random>`, the EdgeMesh Service `<job>-aggregation` (port 7363 named tcp-0, selecting
// worker-type aggregation), and per training worker a pod `<job>-train-<random>` on the host network with
// WORKER_NAME `trainworker-<random>` and its DATASET_NAME. No Lifeline label, annotation or finalizer.
func CreateSednaFLChildren(ctx context.Context, c client.Client, job *v1alpha1.FederatedLearningJob) (*SednaFLChildren, error) {
	const kind = "FederatedLearningJob"
	participants := strconv.Itoa(len(job.Spec.TrainingWorkers))
	out := &SednaFLChildren{}
	out.Aggregator = sednaPod(kind, job, kind, job.Spec.AggregationWorker.Template, "Aggregation", map[string]string{
		"NAMESPACE": job.Namespace, "WORKER_NAME": "aggworker-" + utilrand.String(5), "JOB_NAME": job.Name,
		"AGG_BIND_PORT": "7363", "PARTICIPANTS_COUNT": participants, "TRANSMITTER": "ws",
		"MODEL_URL": "/home/data/model",
	}, false)
	if err := c.Create(ctx, out.Aggregator); err != nil {
		return nil, fmt.Errorf("creating GM's aggregator: %w", err)
	}
	labels := sednaLabels(kind, job, "Aggregation")
	out.Service = &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: strings.ToLower(job.Name + "-aggregation"), Namespace: job.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, v1alpha1.GroupVersion.WithKind(kind))},
		},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{
			Name: "tcp-0", Protocol: corev1.ProtocolTCP, Port: 7363, TargetPort: intstr.FromInt32(7363)}}},
	}
	if err := c.Create(ctx, out.Service); err != nil {
		return nil, fmt.Errorf("creating GM's aggregation service: %w", err)
	}
	for i, tw := range job.Spec.TrainingWorkers {
		pod := sednaPod(kind, job, kind, tw.Template, "train", map[string]string{
			"AGG_PORT": "7363", "AGG_IP": out.Service.Name + "." + job.Namespace,
			"WORKER_NAME": "trainworker-" + utilrand.String(5), "JOB_NAME": job.Name, "PARTICIPANTS_COUNT": participants,
			"NAMESPACE": job.Namespace, "MODEL_NAME": job.Spec.AggregationWorker.Model.Name,
			"DATASET_NAME": tw.Dataset.Name, "LC_SERVER": "http://localhost:9100", "TRANSMITTER": "ws",
		}, true)
		if err := c.Create(ctx, pod); err != nil {
			return nil, fmt.Errorf("creating GM's trainer %d: %w", i, err)
		}
		out.Trainers = append(out.Trainers, pod)
	}
	return out, nil
}

// CreateSednaJIChildren creates, through the API, the children GM's jointinference controller makes
// (createWorkers, runtime.CreateDeploymentWithTemplate, CreateEdgeMeshService): Deployments
// `<ji>-deployment-cloud` and `<ji>-deployment-edge` whose selector, labels and template labels are GM's labels
// (worker-type cloud|edge) plus `app.sedna.io: <ji>-<Cloud|Edge>-svc`, replicas unset, the edge worker on the host
// network, each with a random WORKER_NAME; and the Service `<ji>-cloud` (port 5000 named tcp-0). The Deployment
// controller then makes their pods, which carry no Lifeline label.
func CreateSednaJIChildren(ctx context.Context, c client.Client, ji *v1alpha1.JointInferenceService) ([]*appsv1.Deployment, error) {
	const kind = "JointInferenceService"
	var out []*appsv1.Deployment
	for _, w := range []struct {
		workerType string
		tmpl       corev1.PodTemplateSpec
		env        map[string]string
		host       bool
	}{
		{"Cloud", ji.Spec.CloudWorker.Template, map[string]string{"BIG_MODEL_BIND_PORT": "5000"}, false},
		{"Edge", ji.Spec.EdgeWorker.Template, map[string]string{"BIG_MODEL_IP": strings.ToLower(ji.Name+"-cloud") + "." + ji.Namespace,
			"BIG_MODEL_PORT": "5000", "HEM_NAME": ji.Spec.EdgeWorker.HardExampleMining.Name, "HEM_PARAMETERS": "[]",
			"LC_SERVER": "http://localhost:9100"}, true},
	} {
		env := map[string]string{"NAMESPACE": ji.Namespace, "SERVICE_NAME": ji.Name,
			"WORKER_NAME": strings.ToLower(w.workerType) + "worker-" + utilrand.String(5), "MODEL_URL": "/home/data/model"}
		for k, v := range w.env {
			env[k] = v
		}
		labels := sednaLabels(kind, ji, w.workerType)
		labels["app.sedna.io"] = ji.Name + "-" + w.workerType + "-svc"
		t := w.tmpl.DeepCopy()
		if t.Labels == nil {
			t.Labels = map[string]string{}
		}
		for k, v := range labels {
			t.Labels[k] = v
		}
		for i := range t.Spec.Containers {
			t.Spec.Containers[i].Env = append(t.Spec.Containers[i].Env, sednaEnv(env)...)
		}
		if w.host {
			t.Spec.HostNetwork = true
		}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{
				Name: ji.Name + "-deployment-" + strings.ToLower(w.workerType), Namespace: ji.Namespace, Labels: labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ji, v1alpha1.GroupVersion.WithKind(kind))},
			},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: *t},
		}
		if err := c.Create(ctx, d); err != nil {
			return nil, fmt.Errorf("creating GM's %s deployment: %w", w.workerType, err)
		}
		out = append(out, d)
	}
	labels := sednaLabels(kind, ji, "Cloud")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: strings.ToLower(ji.Name + "-cloud"), Namespace: ji.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ji, v1alpha1.GroupVersion.WithKind(kind))},
		},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{
			Name: "tcp-0", Protocol: corev1.ProtocolTCP, Port: 5000, TargetPort: intstr.FromInt32(5000)}}},
	}
	if err := c.Create(ctx, svc); err != nil {
		return nil, fmt.Errorf("creating GM's cloud service: %w", err)
	}
	return out, nil
}
