// Package contract renders what Sedna worker images expect of their pods: labels, environment variables, model
// and dataset mounts, credentials and edge placement. It is shared by the JointInferenceService and
// FederatedLearningJob renderers.
package contract

import (
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Environment variables of the contract.
const (
	EnvNamespace          = "NAMESPACE"
	EnvServiceName        = "SERVICE_NAME"
	EnvJobName            = "JOB_NAME"
	EnvWorkerName         = "WORKER_NAME"
	EnvModelURL           = "MODEL_URL"
	EnvBigModelBindPort   = "BIG_MODEL_BIND_PORT"
	EnvBigModelIP         = "BIG_MODEL_IP"
	EnvBigModelPort       = "BIG_MODEL_PORT"
	EnvHEMName            = "HEM_NAME"
	EnvHEMParameters      = "HEM_PARAMETERS"
	EnvAggBindPort        = "AGG_BIND_PORT"
	EnvAggIP              = "AGG_IP"
	EnvAggPort            = "AGG_PORT"
	EnvParticipantsCount  = "PARTICIPANTS_COUNT"
	EnvModelName          = "MODEL_NAME"
	EnvDatasetName        = "DATASET_NAME"
	EnvTrainDatasetURL    = "TRAIN_DATASET_URL"
	EnvPretrainedModelURL = "PRETRAINED_MODEL_URL"
	EnvTransmitter        = "TRANSMITTER"
	EnvAggDataPath        = "AGG_DATA_PATH"
	EnvLCServer           = "LC_SERVER"
	EnvDataPathPrefix     = "DATA_PATH_PREFIX"
	EnvS3EndpointURL      = "S3_ENDPOINT_URL"
	EnvAccessKeyID        = "ACCESS_KEY_ID"
	EnvSecretAccessKey    = "SECRET_ACCESS_KEY"
)

// DefaultLCServer is where workers report when the controller is not told otherwise: the node-local report
// endpoint, reachable because edge workers run with the host's network.
const DefaultLCServer = "http://localhost:9100"

// Labels returns the labels Sedna puts on every child of a CR: <kind>.sedna.io/name, /uid and, when workerType
// is set, /worker-type. Selectors of existing children use them, so they must match Sedna's to the letter.
func Labels(kind, name string, uid types.UID, workerType string) map[string]string {
	prefix := LabelPrefix(kind)
	l := map[string]string{prefix + "name": name, prefix + "uid": string(uid)}
	if workerType != "" {
		l[prefix+"worker-type"] = strings.ToLower(workerType)
	}
	return l
}

// Lifeline's own marks on worker pods, shared with the agent (see package lifelinev1).
const (
	RoleLabel               = lifelinev1.RoleLabel
	StandInLabel            = lifelinev1.StandInLabel
	OfflinePolicyAnnotation = lifelinev1.OfflinePolicyAnnotation
	DatasetAnnotation       = lifelinev1.DatasetAnnotation
	DatasetIndexAnnotation  = lifelinev1.DatasetIndexAnnotation
	DatasetFormatAnnotation = lifelinev1.DatasetFormatAnnotation
)

// LabelPrefix is "<kind>.sedna.io/" with the kind lower-cased.
func LabelPrefix(kind string) string {
	return strings.ToLower(kind) + ".sedna.io/"
}

// SetEnv sets vars (literal values) and refs (values from elsewhere, e.g. a Secret's key) on every container of
// spec. A user variable of the same name is replaced, so the contract's value is the only one; the other user
// variables stay in their order, followed by the contract's, sorted, so the rendered pod is the same on every
// pass.
func SetEnv(spec *corev1.PodSpec, vars map[string]string, refs ...corev1.EnvVar) {
	env := envList(vars, refs)
	replaced := make(map[string]bool, len(env))
	for _, e := range env {
		replaced[e.Name] = true
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		kept := c.Env[:0:0]
		for _, e := range c.Env {
			if !replaced[e.Name] {
				kept = append(kept, e)
			}
		}
		c.Env = append(kept, env...)
	}
}

// envList turns vars and refs into environment variables sorted by name; of two of the same name, the ref wins,
// and of two refs, the later.
func envList(vars map[string]string, refs []corev1.EnvVar) []corev1.EnvVar {
	byName := make(map[string]corev1.EnvVar, len(vars)+len(refs))
	for n, v := range vars {
		byName[n] = corev1.EnvVar{Name: n, Value: v}
	}
	for _, e := range refs {
		byName[e.Name] = e
	}
	env := make([]corev1.EnvVar, 0, len(byName))
	for _, e := range byName {
		env = append(env, e)
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	return env
}

// Taints the node lifecycle controller puts on a node that stops reporting.
const (
	TaintUnreachable = "node.kubernetes.io/unreachable"
	TaintNotReady    = "node.kubernetes.io/not-ready"
)

// TolerateDisconnection makes an edge worker stay bound to its node however long the node is cut off: such a
// worker cannot run anywhere else (its device or its data is there), and evicting it only leaves a Pending twin
// pinned to the same node. A toleration the user wrote for the same taint is kept as it is.
func TolerateDisconnection(spec *corev1.PodSpec) {
	for _, key := range []string{TaintUnreachable, TaintNotReady} {
		if hasToleration(spec.Tolerations, key) {
			continue
		}
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{
			Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute,
		})
	}
}

func hasToleration(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if t.Key == key && (t.Effect == corev1.TaintEffectNoExecute || t.Effect == "") {
			return true
		}
	}
	return false
}

// UseHostNetwork runs the worker in the node's network namespace, so LC_SERVER=localhost reaches the node's
// report endpoint; cluster DNS stays usable for the cloud Service unless the user chose a DNS policy.
func UseHostNetwork(spec *corev1.PodSpec) {
	spec.HostNetwork = true
	HostNetworkDNS(spec)
}

// HostNetworkDNS keeps cluster DNS usable (for the cloud Service) in a pod on the host network whose template
// chose no DNS policy: on the host network, ClusterFirst would fall back to the node's resolver.
func HostNetworkDNS(spec *corev1.PodSpec) {
	if spec.HostNetwork && spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	}
}
