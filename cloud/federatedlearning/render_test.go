package federatedlearning

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

func renderInputs(tmpl corev1.PodSpec) inputs {
	job := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Name: "sdd", Namespace: "ns", UID: "u1"}}
	job.Spec.AggregationWorker.Template.Spec = corev1.PodSpec{Containers: []corev1.Container{{Name: "agg"}}}
	job.Spec.TrainingWorkers = []v1alpha1.TrainingWorker{{Dataset: v1alpha1.DatasetRef{Name: "d0"},
		Template: corev1.PodTemplateSpec{Spec: tmpl}}}
	return inputs{
		job:      job,
		model:    &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: v1alpha1.ModelSpec{URL: "/m/model.pb"}},
		datasets: []*v1alpha1.Dataset{{ObjectMeta: metav1.ObjectMeta{Name: "d0"}, Spec: v1alpha1.DatasetSpec{URL: "/d/train.txt", NodeName: "edge7"}}},
		lcServer: contract.DefaultLCServer,
	}
}

func TestTrainerPlacement(t *testing.T) {
	cases := []struct {
		name     string
		tmpl     corev1.PodSpec
		wantNode string
	}{
		{"no placement: the Dataset's node", corev1.PodSpec{}, "edge7"},
		{"nodeName kept", corev1.PodSpec{NodeName: "edge1"}, "edge1"},
		{"nodeSelector kept, no nodeName", corev1.PodSpec{NodeSelector: map[string]string{"zone": "a"}}, ""},
		{"affinity kept, no nodeName", corev1.PodSpec{Affinity: &corev1.Affinity{}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.tmpl.Containers = []corev1.Container{{Name: "train"}}
			pod, err := renderTrainerPod(renderInputs(tc.tmpl), 0)
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != tc.wantNode {
				t.Errorf("nodeName = %q, want %q", pod.Spec.NodeName, tc.wantNode)
			}
			if pod.Name != "sdd-trainworker-0" || pod.Labels[IndexLabel] != "0" || pod.Labels[contract.RoleLabel] != "trainer" {
				t.Errorf("identity: name %s labels %v", pod.Name, pod.Labels)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyOnFailure || !pod.Spec.HostNetwork {
				t.Errorf("restartPolicy %s hostNetwork %v", pod.Spec.RestartPolicy, pod.Spec.HostNetwork)
			}
			if pod.Annotations[contract.OfflinePolicyAnnotation] != "Restart" || len(pod.Finalizers) != 1 {
				t.Errorf("annotations %v finalizers %v", pod.Annotations, pod.Finalizers)
			}
		})
	}
}

func TestAggregatorRendering(t *testing.T) {
	in := renderInputs(corev1.PodSpec{Containers: []corev1.Container{{Name: "train"}}})
	in.job.Spec.AggregationWorker.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod, err := renderAggregatorPod(in)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	want := map[string]string{contract.EnvWorkerName: "sdd-aggworker", contract.EnvAggBindPort: "7363",
		contract.EnvParticipantsCount: "1", contract.EnvTransmitter: "ws", contract.EnvJobName: "sdd",
		contract.EnvModelURL: "/home/data/m/model.pb"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.HostNetwork {
		t.Errorf("the user's restartPolicy must stay and the aggregator stays off the host network: %+v", pod.Spec)
	}
	svc := renderAggregationService(in.job)
	if svc.Name != "sdd-aggregation" || svc.Spec.Ports[0].Port != 7363 || svc.Spec.Ports[0].Name != "tcp-0" ||
		svc.Spec.Selector["federatedlearningjob.sedna.io/worker-type"] != "aggregation" {
		t.Errorf("service %+v", svc)
	}
}
