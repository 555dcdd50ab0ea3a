package simnode

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// Annotations the kubelet puts on a static pod.
const (
	configSourceAnnotation = "kubernetes.io/config.source"
	configHashAnnotation   = "kubernetes.io/config.hash"
)

// isStatic tells whether a pod came from the static-pod directory rather than the API server.
func isStatic(pod *corev1.Pod) bool { return pod.Annotations[configSourceAnnotation] == "file" }

// syncStaticPods runs the pods of the static-pod directory, as edged does with its manifest directory: one pod
// per manifest (JSON or YAML), named `<name>-<node>`, its UID the hash of the manifest; a manifest removed or
// changed stops its pod, and a manifest of a pod so ended is not run again for uidPurgeAfter. Static pods need no
// API server; no mirror pod is created for them, but the wait for one is imitated when asked to (ImitateEdgehub).
func (n *Node) syncStaticPods() {
	if n.cfg.StaticPodDir == "" {
		return
	}
	want := map[types.UID]*corev1.Pod{}
	entries, _ := os.ReadDir(n.cfg.StaticPodDir)
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml" && ext != ".yml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(n.cfg.StaticPodDir, e.Name()))
		if err != nil {
			continue
		}
		pod := &corev1.Pod{}
		if err := yaml.Unmarshal(data, pod); err != nil || pod.Name == "" || len(pod.Spec.Containers) == 0 {
			continue // a manifest being written, or not a pod: looked at again on the next pass
		}
		sum := sha256.Sum256(data)
		hash := hex.EncodeToString(sum[:8])
		pod.Name = pod.Name + "-" + n.cfg.NodeName
		if pod.Namespace == "" {
			pod.Namespace = "default"
		}
		pod.UID = types.UID("static-" + hash)
		pod.Spec.NodeName = n.cfg.NodeName
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[configSourceAnnotation], pod.Annotations[configHashAnnotation] = "file", hash
		want[pod.UID] = pod
	}
	now := time.Now()
	for _, rt := range n.runtimesWhere(func(pod *corev1.Pod) bool { return isStatic(pod) && want[pod.UID] == nil }) {
		n.forget(rt.pod.UID)
		n.mu.Lock()
		n.endedStatic[rt.pod.UID] = now
		n.mu.Unlock()
	}
	n.mu.Lock()
	var added []*corev1.Pod
	for uid, pod := range want {
		if ended, ok := n.endedStatic[uid]; ok && now.Sub(ended) < uidPurgeAfter {
			continue // a pod of a UID the node ended: not again until purged
		}
		delete(n.endedStatic, uid)
		if _, running := n.pods[uid]; !running {
			added = append(added, pod)
		}
	}
	n.mu.Unlock()
	wait := n.hub.mirrorPodWait(time.Now())
	for _, pod := range added {
		n.upsert(pod)
		if wait > 0 {
			n.mu.Lock()
			rt := n.pods[pod.UID]
			n.mu.Unlock()
			rt.mu.Lock()
			rt.notBefore = time.Now().Add(wait)
			rt.mu.Unlock()
		}
	}
}

// uidPurgeAfter is how long a static pod of a UID the node ended is not started again: the kubelet's pod workers
// take no pod of a UID they terminated until housekeeping purged it (pkg/kubelet/pod_workers.go). On the KubeEdge
// rig a static pod re-added 6.5 s and 27.5 s after its removal never started, one re-added 74.5 s after did.
const uidPurgeAfter = time.Minute

// staticPodFile reports whether a pod file of the node's state holds a static pod (those are read from the
// manifest directory again, not from the state).
func staticPodFile(data []byte) bool {
	return strings.Contains(string(data), `"`+configSourceAnnotation+`":"file"`)
}

// tokenWithheld tells whether a static pod waits for a service-account token the node cannot have: edged mounts a
// projected token volume through metamanager, which has no token cached for a new pod and, cut off, serves one
// from its store only when exactly one of that service account is stored (seen on the KubeEdge rig: `serviceaccount
// length from meta db is 0`, back-off 32 s, 64 s; a stand-in copied with its kube-api-access volume never ran in a
// 95 s cut). The hollow node keeps such a pod from starting while edgehub is disconnected. rt.mu held.
func (n *Node) tokenWithheld(rt *podRuntime) bool {
	return isStatic(rt.pod) && len(rt.procs) == 0 && !n.cloudLinked.Load() && mountsServiceAccountToken(rt.pod)
}

// mountsServiceAccountToken tells whether a pod has a projected volume of its service account's token.
func mountsServiceAccountToken(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				return true
			}
		}
	}
	return false
}
