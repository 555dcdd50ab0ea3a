package federatedlearning

import (
	"testing"

	"github.com/google/go-cmp/cmp"
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
			if pod.Annotations[contract.OfflinePolicyAnnotation] != string(v1alpha1.OfflineActionRestart) || len(pod.Finalizers) != 1 {
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

func secretMeta(name string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{contract.AnnotationS3Endpoint: "minio.storage:9000"}}}
}

// TestRenderedPodsHoldNoCredentialValue: wherever a credential is used — the model's, the dataset's, the
// pretrained model's, the transmitter's — every worker container and storage initializer reads the keys from the
// Secret by reference; a literal key in a pod spec would be readable by every edge agent and stored on its disk.
func TestRenderedPodsHoldNoCredentialValue(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(*inputs)
		secret string // the Secret the keys must come from
		inInit bool   // the storage initializer reads them (downloads); otherwise the workers do
	}{
		{"model on s3", func(in *inputs) {
			in.model.Spec.URL, in.model.Spec.CredentialName = "s3://models/m.pb", "model-cred"
		}, "model-cred", true},
		{"dataset on s3", func(in *inputs) {
			in.datasets[0].Spec.URL, in.datasets[0].Spec.CredentialName = "s3://data/train.txt", "data-cred"
		}, "data-cred", true},
		{"pretrained model on s3", func(in *inputs) {
			in.job.Spec.PretrainedModel = &v1alpha1.PretrainedModel{Name: "pre"}
			in.pretrainedModel = &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Name: "pre"},
				Spec: v1alpha1.ModelSpec{URL: "s3://models/pre.pb", CredentialName: "pre-cred"}}
		}, "pre-cred", true},
		{"s3 transmitter", func(in *inputs) {
			in.job.Spec.Transmitter = &v1alpha1.Transmitter{S3: &v1alpha1.S3Transmitter{AggDataPath: "s3://agg/", CredentialName: "tx-cred"}}
		}, "tx-cred", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := renderInputs(corev1.PodSpec{Containers: []corev1.Container{{Name: "train"}}})
			tc.edit(&in)
			in.secrets = map[string]*metav1.PartialObjectMetadata{tc.secret: secretMeta(tc.secret)}
			for _, id := range identities(in.job) {
				pod, err := renderWorker(in, id)
				if err != nil {
					t.Fatal(err)
				}
				containers := pod.Spec.Containers
				if tc.inInit {
					containers = pod.Spec.InitContainers
				}
				refs := 0
				for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
					for _, e := range c.Env {
						if e.Name != contract.EnvAccessKeyID && e.Name != contract.EnvSecretAccessKey {
							continue
						}
						if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
							e.ValueFrom.SecretKeyRef.Name != tc.secret || e.ValueFrom.SecretKeyRef.Key != e.Name {
							t.Errorf("%s container %s: %s = %+v, want a reference to key %s of Secret %s", id.name, c.Name, e.Name, e, e.Name, tc.secret)
						}
					}
				}
				for _, c := range containers {
					for _, e := range c.Env {
						if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
							refs++
						}
					}
				}
				// The dataset is the trainers' only; the other credentials reach every worker.
				if want := 2; refs != want && (tc.secret != "data-cred" || id.role == v1alpha1.WorkerRoleTrainer) {
					t.Errorf("%s: %d key references where they are used, want %d", id.name, refs, want)
				}
			}
		})
	}
}

func TestTrainerTellsItsAgentWhereTheDatasetIndexIs(t *testing.T) {
	for _, c := range []struct {
		name, url, format string
		want              map[string]string // nil: no marks
	}{
		{"txt on the node", "/d/./train.txt", "TXT", map[string]string{contract.DatasetAnnotation: "d0",
			contract.DatasetIndexAnnotation: "/d/train.txt", contract.DatasetFormatAnnotation: "txt"}},
		{"csv on the node", "/d/train.csv", "csv", map[string]string{contract.DatasetAnnotation: "d0",
			contract.DatasetIndexAnnotation: "/d/train.csv", contract.DatasetFormatAnnotation: "csv"}},
		{"on s3: not the node's to count", "s3://b/train.txt", "txt", nil},
		{"a format Sedna does not count", "/d/images", "jpg", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := renderInputs(corev1.PodSpec{Containers: []corev1.Container{{Name: "train"}}})
			in.datasets[0].Spec.URL, in.datasets[0].Spec.Format = c.url, c.format
			pod, err := renderTrainerPod(in, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, k := range []string{contract.DatasetAnnotation, contract.DatasetIndexAnnotation, contract.DatasetFormatAnnotation} {
				if v, ok := pod.Annotations[k]; ok {
					got[k] = v
				}
			}
			if c.want == nil {
				c.want = map[string]string{}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("dataset marks (-want +got):\n%s", diff)
			}
		})
	}
}
