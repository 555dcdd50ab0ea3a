package lifelinev1

import (
	"fmt"
	"strings"
	"time"
)

// Lifeline's own marks, shared by the controller that sets them and the agent that reads them, or by the agent
// that writes them and reads them back; this package is the one both sides import.
const (
	// MarkPrefix begins every label and annotation key of Lifeline's: what the agent keeps of a pod's marks.
	MarkPrefix = "lifeline.sedna.io/"
	// RoleLabel on a worker pod names its role (edge, cloud, aggregator, trainer); the controller's pod cache and
	// the edge agent select worker pods by it.
	RoleLabel = "lifeline.sedna.io/role"
	// OfflinePolicyAnnotation on a worker pod tells the edge agent what to do for it while the node is cut off
	// from the API server [P-HEAL-1].
	OfflinePolicyAnnotation = "lifeline.sedna.io/offline-policy"
	// StaticPodOfAnnotation marks a static-pod manifest the agent wrote, with the worker it stands in for, as
	// StaticPodOf writes it [P-HEAL-3].
	StaticPodOfAnnotation = "lifeline.sedna.io/static-pod-of"
	// StandInLabel ("true") on a stand-in's pod, and so on its mirror pod, tells it apart from the worker whose
	// labels it carries: a selector with !lifeline.sedna.io/stand-in lists the workers alone.
	StandInLabel = "lifeline.sedna.io/stand-in"
	// DatasetAnnotation, DatasetIndexAnnotation and DatasetFormatAnnotation on a trainer pod name its Dataset,
	// the index file of that Dataset on the node (a node path) and its format (txt or csv), so the node's agent
	// counts the Dataset's samples as Sedna's local controller does [P-DS-1].
	DatasetAnnotation       = "lifeline.sedna.io/dataset"
	DatasetIndexAnnotation  = "lifeline.sedna.io/dataset-index"
	DatasetFormatAnnotation = "lifeline.sedna.io/dataset-format"
	// WorkloadFinishedAnnotation on a worker pod that ended says its workload finished and will never run it again:
	// the pod is kept (its logs, its end), yet no node's agent stands in for it any more [P-DES-4].
	WorkloadFinishedAnnotation = "lifeline.sedna.io/workload-finished"
)

// The values of OfflinePolicyAnnotation: the workload's spec says one, the controller writes it on the worker's
// pod, and the node's agent acts on it. Absent, or any other value, is Restart.
const (
	// OfflinePolicyRestart: the agent heals a dead worker while the node is cut off (restarts or rebuilds it).
	OfflinePolicyRestart = "Restart"
	// OfflinePolicyNone: the agent only reports the worker's state; nothing is healed until the API server is back.
	OfflinePolicyNone = "None"
)

// StaticPodOf is the value of StaticPodOfAnnotation for a worker: "<namespace>/<pod>".
func StaticPodOf(namespace, pod string) string { return namespace + "/" + pod }

// StandInPods are the names of the pods in a worker's two stand-in manifests [P-HEAL-3]: the agent arms the next
// stand-in in one while the other stands in, and a node makes a static pod of the same name anew only once the last
// one ended and its mirror pod went. A node names the pod it runs from each <name>-<node> (StandInPodsOn).
func StandInPods(pod string) [2]string { return [2]string{pod, pod + "-b"} }

// StandInPodsOn are the names of the pods node runs for a worker's stand-ins, and of their mirror pods.
func StandInPodsOn(pod, node string) [2]string {
	names := StandInPods(pod)
	return [2]string{names[0] + "-" + node, names[1] + "-" + node}
}

// ParseStaticPodOf reads a StaticPodOfAnnotation value; ok is false unless it names a worker as StaticPodOf
// does, a DNS-1123 label and a DNS-1123 subdomain.
func ParseStaticPodOf(v string) (namespace, pod string, ok bool) {
	namespace, pod, ok = strings.Cut(v, "/")
	if !ok || CheckDNSLabel(namespace) != nil || CheckDNSSubdomain(pod) != nil {
		return "", "", false
	}
	return namespace, pod, true
}

// CommandID is the id of the controller's command for one episode of a worker, "<action>/<pod uid>/<episode>"
// [P-CMD-5]: one id per death, so a repeated command is a duplicate.
func CommandID(action Action, podUID string, episode uint64) string {
	return fmt.Sprintf("%s/%s/%d", strings.ToLower(strings.TrimPrefix(action.String(), "ACTION_")), podUID, episode)
}

// LocalResultID is the command id of a result of the agent's own action, "local/<pod uid>/<unix nanos>":
// unique, and carrying no meaning a receiver may rely on [P-HEAL-2].
func LocalResultID(podUID string, at time.Time) string {
	return fmt.Sprintf("local/%s/%d", podUID, at.UnixNano())
}
