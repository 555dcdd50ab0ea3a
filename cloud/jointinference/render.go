// Package jointinference reconciles JointInferenceServices into their children: the cloud and edge worker
// Deployments, the cloud worker's Service, and HPAs.
package jointinference

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// Kind is the kind this package reconciles.
const Kind = "JointInferenceService"

// BigModelPort is the cloud worker's port, behind the `<name>-cloud` Service.
const BigModelPort = 5000

// Worker types, as they appear in names and labels.
const (
	workerEdge  = "edge"
	workerCloud = "cloud"
)

// TemplateHashAnnotation records the hash of what Lifeline rendered for a child, so a child is updated exactly
// when its rendering changes, whatever the API server's defaulting added to it.
const TemplateHashAnnotation = "lifeline.sedna.io/template-hash"

// sednaAppLabel is the EdgeMesh label Sedna adds to worker Deployments and their selectors; it is kept because a
// Deployment's selector cannot change.
const sednaAppLabel = "app.sedna.io"

// DeploymentName is `<ji>-deployment-<edge|cloud>`, Sedna's name.
func DeploymentName(ji string, workerType string) string { return ji + "-deployment-" + workerType }

// ServiceName is `<ji>-cloud`, Sedna's name for the cloud worker's Service.
func ServiceName(ji string) string { return ji + "-" + workerCloud }

// HPAName is `hpa-<deployment>`, Sedna's name.
func HPAName(deployment string) string { return "hpa-" + deployment }

// inputs is everything a rendering depends on: the service, the Models it names, the metadata of the Secrets
// those name, and the controller's settings. The reconciler reads them from its cache; the render functions
// never do I/O.
type inputs struct {
	ji         *v1alpha1.JointInferenceService
	edgeModel  *v1alpha1.Model
	cloudModel *v1alpha1.Model
	secrets    map[string]*metav1.PartialObjectMetadata
	lcServer   string
}

// workerLabels are the labels of one worker's Deployment, its pods and its selector.
func workerLabels(ji *v1alpha1.JointInferenceService, workerType string) map[string]string {
	l := contract.Labels(Kind, ji.Name, ji.UID, workerType)
	// Sedna capitalises the worker type here ("Edge", "Cloud").
	l[sednaAppLabel] = ji.Name + "-" + capitalize(workerType) + "-svc"
	return l
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

func ownerRef(ji *v1alpha1.JointInferenceService) metav1.OwnerReference {
	return *metav1.NewControllerRef(ji, v1alpha1.GroupVersion.WithKind(Kind))
}

// renderCloudDeployment renders the big-model worker.
func renderCloudDeployment(in inputs) (*appsv1.Deployment, error) {
	w := in.ji.Spec.CloudWorker
	env := map[string]string{contract.EnvBigModelBindPort: strconv.Itoa(BigModelPort)}
	d, err := renderWorkerDeployment(in, workerCloud, w.Template, in.cloudModel, env)
	if err != nil {
		return nil, err
	}
	setReplicas(d, w.HPA)
	return d, nil
}

// renderEdgeDeployment renders the small-model worker: pinned to its edge node, tolerant of the node's
// disconnection, and never surging on its device. Whether it runs on the host network is the template's choice,
// as with Sedna (see contract.HostNetworkDNS).
func renderEdgeDeployment(in inputs) (*appsv1.Deployment, error) {
	w := in.ji.Spec.EdgeWorker
	params, err := json.Marshal(hemParameters(w.HardExampleMining.Parameters))
	if err != nil {
		return nil, fmt.Errorf("encoding hard example mining parameters: %w", err)
	}
	env := map[string]string{
		contract.EnvBigModelIP:    ServiceName(in.ji.Name) + "." + in.ji.Namespace,
		contract.EnvBigModelPort:  strconv.Itoa(BigModelPort),
		contract.EnvHEMName:       w.HardExampleMining.Name,
		contract.EnvHEMParameters: string(params),
		contract.EnvLCServer:      in.lcServer,
	}
	d, err := renderWorkerDeployment(in, workerEdge, w.Template, in.edgeModel, env)
	if err != nil {
		return nil, err
	}
	spec := &d.Spec.Template.Spec
	contract.HostNetworkDNS(spec)
	contract.TolerateDisconnection(spec)
	d.Spec.Strategy = edgeStrategy(w.Strategy)
	d.Spec.Template.Annotations = merge(d.Spec.Template.Annotations,
		map[string]string{contract.OfflinePolicyAnnotation: string(offlineAction(w.OfflinePolicy))})
	setReplicas(d, w.HPA)
	return d, nil
}

func offlineAction(p *v1alpha1.OfflinePolicy) v1alpha1.OfflineAction {
	if p == nil || p.Action == "" {
		return v1alpha1.OfflineActionRestart
	}
	return p.Action
}

// hemParameters keeps Sedna's encoding of an absent list: `[]`, never `null`.
func hemParameters(p []v1alpha1.ParaSpec) []v1alpha1.ParaSpec {
	if p == nil {
		return []v1alpha1.ParaSpec{}
	}
	return p
}

func edgeStrategy(s *appsv1.DeploymentStrategy) appsv1.DeploymentStrategy {
	if s != nil {
		return *s.DeepCopy()
	}
	return appsv1.DeploymentStrategy{
		Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxSurge:       ptr.To(intstr.FromInt32(0)),
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
		},
	}
}

// setReplicas leaves the replica count to the HPA when there is one; otherwise one worker, as Sedna runs it.
func setReplicas(d *appsv1.Deployment, hpa *v1alpha1.HPA) {
	if hpa == nil {
		d.Spec.Replicas = ptr.To[int32](1)
		return
	}
	d.Spec.Replicas = nil
}

func renderWorkerDeployment(in inputs, workerType string, tmpl corev1.PodTemplateSpec, model *v1alpha1.Model,
	env map[string]string) (*appsv1.Deployment, error) {
	ji := in.ji
	name := DeploymentName(ji.Name, workerType)
	labels := workerLabels(ji, workerType)
	t := *tmpl.DeepCopy()
	t.Labels = merge(t.Labels, labels)
	t.Labels[contract.RoleLabel] = workerType

	var credential *metav1.PartialObjectMetadata
	if model.Spec.CredentialName != "" {
		credential = in.secrets[model.Spec.CredentialName]
	}
	storageEnv, err := contract.MountStorage(&t.Spec, []contract.Storage{
		{EnvName: contract.EnvModelURL, URL: model.Spec.URL, Credential: credential},
	})
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", model.Name, err)
	}
	env = merge(env, storageEnv)
	env[contract.EnvNamespace] = ji.Namespace
	env[contract.EnvServiceName] = ji.Name
	env[contract.EnvWorkerName] = name
	contract.SetEnv(&t.Spec, env)

	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       ji.Namespace,
			Labels:          merge(nil, labels),
			OwnerReferences: []metav1.OwnerReference{ownerRef(ji)},
		},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: merge(nil, labels)},
			Template: t,
		},
	}
	return d, nil
}

// renderCloudService renders the Service in front of the cloud worker. The port name `tcp-0` is what EdgeMesh
// needs to route to it from the edge.
func renderCloudService(ji *v1alpha1.JointInferenceService) *corev1.Service {
	labels := contract.Labels(Kind, ji.Name, ji.UID, workerCloud)
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            ServiceName(ji.Name),
			Namespace:       ji.Namespace,
			Labels:          labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef(ji)},
		},
		Spec: corev1.ServiceSpec{
			Selector: merge(nil, labels),
			Ports: []corev1.ServicePort{{
				Name: "tcp-0", Protocol: corev1.ProtocolTCP, Port: BigModelPort, TargetPort: intstr.FromInt32(BigModelPort),
			}},
		},
	}
}

// renderHPA renders the autoscaler of one worker's Deployment, or nil when the worker has none.
func renderHPA(ji *v1alpha1.JointInferenceService, workerType string, hpa *v1alpha1.HPA) *autoscalingv2.HorizontalPodAutoscaler {
	if hpa == nil {
		return nil
	}
	deployment := DeploymentName(ji.Name, workerType)
	h := hpa.DeepCopy()
	return &autoscalingv2.HorizontalPodAutoscaler{
		TypeMeta: metav1.TypeMeta{APIVersion: "autoscaling/v2", Kind: "HorizontalPodAutoscaler"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            HPAName(deployment),
			Namespace:       ji.Namespace,
			Labels:          contract.Labels(Kind, ji.Name, ji.UID, workerType),
			OwnerReferences: []metav1.OwnerReference{ownerRef(ji)},
		},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: deployment},
			MinReplicas:    h.MinReplicas,
			MaxReplicas:    h.MaxReplicas,
			Metrics:        h.Metrics,
			Behavior:       h.Behavior,
		},
	}
}

// templateHash is a stable digest of what was rendered for a child.
func templateHash(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		// Rendered API objects always encode; a failure here is a programming error.
		panic(fmt.Sprintf("encoding rendered object: %v", err))
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
