package desiredsets

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func workerPod(name, node string, phase corev1.PodPhase) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
			Labels:      map[string]string{lifelinev1.RoleLabel: "trainer", "app": name},
			Annotations: map[string]string{lifelinev1.OfflinePolicyAnnotation: lifelinev1.OfflinePolicyRestart}},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "main", Image: "trainer:v1",
				Env: []corev1.EnvVar{{Name: "WORKER_NAME", Value: name}, {Name: "SECRET", ValueFrom: &corev1.EnvVarSource{}}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// decodedManifest reads a set's manifest as the agent's decoder would see its fields.
func decodedManifest(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("manifest %q does not decode: %v", raw, err)
	}
	return m
}

// [P-DES-1] [P-DES-3] [P-DES-4]: the set is the node's workers, sorted, each with its pod as a static pod of it; a
// pod that ended in a finished workload is none.
func TestRenderSetIsTheNodesWorkersWithTheirStaticManifests(t *testing.T) {
	mirror := workerPod("mirror", "edge-1", corev1.PodRunning)
	mirror.Annotations[corev1.MirrorPodAnnotationKey] = "x"
	standIn := workerPod("standin", "edge-1", corev1.PodRunning)
	standIn.Annotations[lifelinev1.StaticPodOfAnnotation] = "default/b"
	unlabelled := workerPod("plain", "edge-1", corev1.PodRunning)
	delete(unlabelled.Labels, lifelinev1.RoleLabel)
	finished := workerPod("finished", "edge-1", corev1.PodFailed)
	finished.Annotations[lifelinev1.WorkloadFinishedAnnotation] = "true"
	pods := []corev1.Pod{workerPod("b", "edge-1", corev1.PodPending), workerPod("a", "edge-1", corev1.PodRunning),
		workerPod("other", "edge-2", corev1.PodRunning), mirror, standIn, unlabelled, finished}

	set := renderSet("edge-1", pods)
	if set.Node != "edge-1" || len(set.Workers) != 2 || set.Dropped != 0 {
		t.Fatalf("set %v: want edge-1's two workers", set)
	}
	if got := []string{set.Workers[0].PodUid, set.Workers[1].PodUid}; got[0] != "uid-a" || got[1] != "uid-b" {
		t.Errorf("workers %v, want uid-a then uid-b", got)
	}
	if !set.Workers[0].Started || set.Workers[1].Started {
		t.Errorf("started %t, %t: want a (Running) started, b (Pending) not", set.Workers[0].Started, set.Workers[1].Started)
	}
	m := decodedManifest(t, set.Workers[0].Manifest)
	spec := m["spec"].(map[string]any)
	meta := m["metadata"].(map[string]any)
	switch {
	case m["apiVersion"] != "v1" || m["kind"] != "Pod":
		t.Errorf("manifest %v is not a v1 Pod", m)
	case spec["nodeName"] != nil:
		t.Errorf("manifest keeps the node it was bound to: %v", spec["nodeName"])
	case meta["name"] != "a" || meta["namespace"] != "default" || meta["uid"] != nil:
		t.Errorf("metadata %v: want name and namespace, no uid", meta)
	case spec["restartPolicy"] != "Never" || !strings.Contains(string(set.Workers[0].Manifest), `"image":"trainer:v1"`):
		t.Errorf("spec %v: want the pod's own", spec)
	case set.Workers[0].ManifestBytes != 0:
		t.Errorf("manifest_bytes %d on a manifest within the bound", set.Workers[0].ManifestBytes)
	}
}

// [P-DES-3]: a manifest beyond its bound leaves only the marks the agent reads, and says its size; manifests
// beyond the set's bound are left out largest first.
func TestRenderSetLeavesOutManifestsBeyondTheBounds(t *testing.T) {
	huge := workerPod("huge", "edge-1", corev1.PodRunning)
	huge.Annotations["tenant.example/blob"] = strings.Repeat("x", lifelinev1.MaxManifestBytes)
	huge.Annotations[lifelinev1.DatasetAnnotation] = "ds"
	huge.Annotations[lifelinev1.MarkPrefix+"long"] = strings.Repeat("y", lifelinev1.MaxMarkBytes+1)
	set := renderSet("edge-1", []corev1.Pod{huge, workerPod("small", "edge-1", corev1.PodRunning)})
	w := set.Workers[0]
	if w.ManifestBytes <= lifelinev1.MaxManifestBytes {
		t.Fatalf("manifest_bytes %d, want the whole manifest's size, beyond %d", w.ManifestBytes, lifelinev1.MaxManifestBytes)
	}
	m := decodedManifest(t, w.Manifest)
	meta := m["metadata"].(map[string]any)
	annotations := meta["annotations"].(map[string]any)
	if _, kept := annotations["tenant.example/blob"]; kept || annotations[lifelinev1.DatasetAnnotation] != "ds" || annotations[lifelinev1.MarkPrefix+"long"] != nil {
		t.Errorf("annotations %v: want Lifeline's within the mark bound only", annotations)
	}
	if labels := meta["labels"].(map[string]any); len(labels) != 1 || labels[lifelinev1.RoleLabel] != "trainer" {
		t.Errorf("labels %v: want the role label only", labels)
	}
	if env := m["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["env"].([]any); len(env) != 1 {
		t.Errorf("env %v: want WORKER_NAME only", env)
	}
	if set.Workers[1].ManifestBytes != 0 {
		t.Errorf("the small worker's manifest was left out too")
	}

	// 40 workers of 120 KiB each: 4.7 MiB of manifests, beyond MaxDesiredBytes.
	var many []corev1.Pod
	for i := range 40 {
		p := workerPod(strings.Repeat("w", i+1), "edge-1", corev1.PodRunning)
		p.Annotations["tenant.example/blob"] = strings.Repeat("x", 120<<10+i)
		many = append(many, p)
	}
	set = renderSet("edge-1", many)
	total, leftOut := 0, 0
	for _, w := range set.Workers {
		if w.ManifestBytes > 0 {
			leftOut++
			continue
		}
		total += len(w.Manifest)
	}
	if len(set.Workers) != 40 || total > lifelinev1.MaxDesiredBytes || leftOut == 0 {
		t.Errorf("%d workers, %d bytes of manifests kept, %d left out: want all 40, within %d", len(set.Workers), total, leftOut, lifelinev1.MaxDesiredBytes)
	}
}
