package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lifeline-edge/lifeline/test/harness"
)

// KwokLabel marks the Nodes kwok keeps alive. Removing it from a Node cuts the node off: the Node leaves kwok's
// watch, which is filtered by the API server, so kwok stops renewing its Lease and the node lifecycle controller
// turns its Ready condition Unknown after its grace period, as for a real edge node that lost the API server. (An
// annotation would not do: kwok filters annotations itself and keeps renewing the Leases of Nodes that lose one.)
const (
	KwokLabel = "kwok.x-k8s.io/node"
	kwokValue = "fake"
)

// kwokStages are the lifecycles kwok plays: a new Node turns Ready (its Lease renewed from then on, by kwok's
// lease controller), and a Pod bound to a managed Node runs with its containers ready, an armed stand-in's mirror
// pod at its gate, never Ready (its readiness gate unmet, as the real nodes show it); a deleted Pod goes once its
// finalizers are gone. Nothing else changes, so what the controller sees after start-up is only what the
// harness does.
//
// kwok renews Leases 4 at a time by default: at 1,000 nodes on a busy API server that falls behind the
// renewals, and Nodes turn not Ready though nothing cut them off; 32 keep up. A configuration given to kwok is
// not defaulted, so the other parallelisms are its defaults, spelled out.
var kwokStages = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodeLeaseParallelism: 32
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 4
  podsOnNodeSyncParallelism: 1
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: scale-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: .status.phase
      operator: NotIn
      values: [Running]
  next:
    statusTemplate: |
      phase: Running
      addresses:
      - type: InternalIP
        address: {{ NodeIP }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok plays this node
        lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
` + podRunningStage("scale-pod-running", "DoesNotExist", `status: "True"`) +
	podRunningStage("scale-stand-in-armed", "Exists", `status: "False"
        reason: ReadinessGatesNotReady
        message: 'corresponding condition of pod readiness gate "lifeline.sedna.io/stand-in" does not exist.'`) + `---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: scale-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
`

// podRunningStage is a Stage that runs a pod bound to a managed Node with its containers ready and started,
// for the pods whose stand-in label is standIn (Exists or DoesNotExist), their Ready condition as ready says.
func podRunningStage(name, standIn, ready string) string {
	return fmt.Sprintf(`---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: %s
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.podIP
      operator: DoesNotExist
    - key: '.metadata.labels["lifeline.sedna.io/stand-in"]'
      operator: %s
  next:
    statusTemplate: |
      phase: Running
      hostIP: {{ NodeIPWith .spec.nodeName }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      startTime: {{ Now | Quote }}
      conditions:
      - type: Ready
        %s
        lastTransitionTime: {{ Now | Quote }}
      - type: ContainersReady
        status: "True"
        lastTransitionTime: {{ Now | Quote }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name }}
        image: {{ .image }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ Now | Quote }}
      {{ end }}
`, name, standIn, ready)
}

// startKwok runs bin/kwok beside the control plane, managing the Nodes that carry KwokLabel. Their Leases last
// lease and are renewed every quarter of it, as the kubelet's: a lease as long as the node lifecycle controller's
// grace period keeps a node kwok plays Ready.
func startKwok(cp *harness.ControlPlane, lease time.Duration) (*harness.Process, error) {
	conf := filepath.Join(cp.Dir, "kwok-stages.yaml")
	if err := os.WriteFile(conf, []byte(kwokStages), 0o600); err != nil {
		return nil, fmt.Errorf("writing kwok's stages: %w", err)
	}
	args := []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--config=" + conf,
		"--manage-nodes-with-label-selector=" + KwokLabel + "=" + kwokValue,
		"--node-lease-duration-seconds=" + strconv.Itoa(int(lease.Seconds())),
		"--cidr=10.128.0.0/10",
		"--node-ip=10.96.0.1",
		"--server-address=",
		"--v=WARN",
	}
	p, err := cp.Launch("kwok", filepath.Join(cp.BinDir, "kwok"), args, nil)
	if err != nil {
		return nil, fmt.Errorf("starting kwok: %w", err)
	}
	return p, nil
}
