package liveness

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// workerPod is a worker pod as the controllers render it: Sedna's labels and the contract's variables.
func workerPod(name, node, kind, owner, worker string) *corev1.Pod {
	env := map[string]string{contract.EnvWorkerName: worker, contract.EnvNamespace: "default"}
	env[ownerNameEnv[kind]] = owner
	spec := corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main"}}}
	contract.SetEnv(&spec, env)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
		Labels: contract.Labels(kind, owner, "owner-uid", "edge")}, Spec: spec}
}

// What the tracker checks of a pod is read from the pod as the controllers render it.
func TestPodInfoOfRenderedWorkers(t *testing.T) {
	cases := []struct {
		pod  *corev1.Pod
		want PodInfo
	}{
		{workerPod("svc-edge-5d8f-x", "edge1", "JointInferenceService", "svc", "svc-edge"),
			PodInfo{Node: "edge1", UID: "uid-svc-edge-5d8f-x", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}},
		{workerPod("job-trainworker-0", "edge2", "FederatedLearningJob", "job", "job-trainworker-0"),
			PodInfo{Node: "edge2", UID: "uid-job-trainworker-0", Worker: "job-trainworker-0", OwnerKind: "FederatedLearningJob", OwnerName: "job"}},
		{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", UID: "u"}}, PodInfo{UID: "u"}},
	}
	for _, c := range cases {
		if got := PodInfoOf(c.pod); got != c.want {
			t.Errorf("PodInfoOf(%s) = %+v, want %+v", c.pod.Name, got, c.want)
		}
	}
}

// CachePods finds a pod by name and the pods of a worker by WORKER_NAME, through the cache's index.
func TestCachePodsReadsTheIndex(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// A stand-in's mirror pod carries its worker's labels and WORKER_NAME: it is none of the worker's pods.
	mirror := workerPod("svc-edge-a-edge1", "edge1", "JointInferenceService", "svc", "svc-edge")
	mirror.Annotations = map[string]string{contract.MirrorAnnotation: "8ca8cad6"}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&corev1.Pod{}, WorkerNameIndex, IndexWorkerName).
		WithObjects(workerPod("svc-edge-a", "edge1", "JointInferenceService", "svc", "svc-edge"),
			workerPod("svc-edge-b", "edge2", "JointInferenceService", "svc", "svc-edge"), mirror,
			workerPod("job-trainworker-0", "edge1", "FederatedLearningJob", "job", "job-trainworker-0")).Build()
	pods := CachePods{Reader: reader}
	if info, ok := pods.Pod("default", "job-trainworker-0"); !ok || info.Node != "edge1" || info.OwnerName != "job" {
		t.Errorf("Pod = %+v, %v", info, ok)
	}
	if _, ok := pods.Pod("default", "nobody"); ok {
		t.Errorf("a pod the cache does not have was found")
	}
	workers := pods.Workers("default", "svc-edge")
	if kind, owner, reason := reportOwner("edge2", &lifelinev1.Report{OwnerName: "sedna"}, workers); len(workers) != 2 || reason != "" ||
		kind != "JointInferenceService" || owner != "svc" {
		t.Errorf("Workers(svc-edge) = %+v, want both replicas, one on edge2", workers)
	}
	if got := pods.Workers("other", "svc-edge"); len(got) != 0 {
		t.Errorf("workers of another namespace: %+v", got)
	}
}
