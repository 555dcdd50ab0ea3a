package manager

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// workerPod is a trainer pod as the API server returns it: what Lifeline rendered, with the API server's
// defaults and the kubelet's status.
func workerPod() *corev1.Pod {
	started := metav1.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fl-trainer-0", UID: "uid-1",
			Labels:        map[string]string{contract.RoleLabel: "trainer", "federatedlearningjob.sedna.io/name": "fl"},
			Finalizers:    []string{"sedna.io/worker-accounting"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "lifeline-controller"}}},
		Spec: corev1.PodSpec{
			NodeName: "edge-1", RestartPolicy: corev1.RestartPolicyOnFailure,
			Volumes:     []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}},
			Containers: []corev1.Container{{Name: "train", Image: "surface-defect-train:v0.3.0",
				Env: []corev1.EnvVar{{Name: contract.EnvJobName, Value: "fl"}, {Name: contract.EnvModelURL, Value: "/model"},
					{Name: contract.EnvWorkerName, Value: "fl-trainer-0"}, {Name: contract.EnvDatasetName, Value: "data-1"},
					{Name: "HTTP_PROXY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "proxy"}}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets"}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "the node ran out of memory",
			PodIP: "10.0.0.7", HostIP: "192.168.1.2", StartTime: &started, QOSClass: corev1.PodQOSBestEffort,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: started},
				{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, LastTransitionTime: started}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "train", Image: "surface-defect-train:v0.3.0", ImageID: "sha256:ab",
				ContainerID: "containerd://1", RestartCount: 3,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}},
		},
	}
}

func TestTheCacheKeepsOfAWorkerPodWhatTheControllersRead(t *testing.T) {
	full := workerPod()
	out, err := cachedWorkerPod(workerPod())
	if err != nil {
		t.Fatal(err)
	}
	kept := out.(*corev1.Pod)

	want := full.DeepCopy()
	want.ManagedFields = nil
	if !reflect.DeepEqual(kept.ObjectMeta, want.ObjectMeta) {
		t.Errorf("metadata %+v, want %+v", kept.ObjectMeta, want.ObjectMeta)
	}
	wantSpec := corev1.PodSpec{NodeName: "edge-1", RestartPolicy: corev1.RestartPolicyOnFailure,
		Containers: []corev1.Container{{Name: "train", Env: []corev1.EnvVar{{Name: contract.EnvJobName, Value: "fl"},
			{Name: contract.EnvWorkerName, Value: "fl-trainer-0"}, {Name: contract.EnvDatasetName, Value: "data-1"}}}}}
	if !reflect.DeepEqual(kept.Spec, wantSpec) {
		t.Errorf("spec %+v, want %+v", kept.Spec, wantSpec)
	}
	wantStatus := corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "the node ran out of memory",
		Conditions: full.Status.Conditions, ContainerStatuses: []corev1.ContainerStatus{{Name: "train", RestartCount: 3,
			State: full.Status.ContainerStatuses[0].State}}}
	if !reflect.DeepEqual(kept.Status, wantStatus) {
		t.Errorf("status %+v, want %+v", kept.Status, wantStatus)
	}
	if got, want := liveness.PodInfoOf(kept), liveness.PodInfoOf(full); got != want {
		t.Errorf("the liveness table reads the cached pod as %+v, the pod as %+v", got, want)
	}
}

func TestTheCacheKeepsOfANodeItsMetadataAndConditions(t *testing.T) {
	conditions := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: "LifelineAgent", Status: corev1.ConditionFalse, Reason: "APIServerUnreachable"}}
	meta := metav1.ObjectMeta{Name: "edge-1", UID: "uid-2", Labels: map[string]string{"node-role.kubernetes.io/edge": ""}}
	full := &corev1.Node{ObjectMeta: *meta.DeepCopy(),
		Spec: corev1.NodeSpec{PodCIDR: "10.0.1.0/24", Taints: []corev1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.NodeStatus{Conditions: conditions, Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.2"}},
			Images:   []corev1.ContainerImage{{Names: []string{"surface-defect-train:v0.3.0"}, SizeBytes: 1 << 30}},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.31.0-kubeedge-v1.22.0"}}}
	full.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	out, err := cachedNode(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Node{ObjectMeta: meta, Status: corev1.NodeStatus{Conditions: conditions}}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("cached node %+v, want %+v", out, want)
	}
}

func TestTheCacheLeavesWhatIsNotAPodOrANodeAsItIs(t *testing.T) {
	gone := cache.DeletedFinalStateUnknown{Key: "ns/fl-trainer-0", Obj: workerPod()}
	for name, transform := range map[string]cache.TransformFunc{"pods": cachedWorkerPod, "nodes": cachedNode} {
		out, err := transform(gone)
		if err != nil || !reflect.DeepEqual(out, gone) {
			t.Errorf("the %s' transform turned %T into %+v, %v; want it unchanged", name, gone, out, err)
		}
	}
}
