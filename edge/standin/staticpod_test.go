package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// renderedTrainer is an FL trainer as the controller renders it and the API server admits it: on the host
// network, its Dataset's node directory mounted at /home/data/<dir>, and the service-account token volume that
// admission adds.
const renderedTrainer = `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"default","name":"fl-trainer-0"},
"spec":{"hostNetwork":true,"dnsPolicy":"ClusterFirstWithHostNet","restartPolicy":"Never","serviceAccountName":"default",
"volumes":[{"name":"sedna-host-data-surface-defects","hostPath":{"path":"/data/surface-defects","type":"Directory"}},
{"name":"kube-api-access-x1","projected":{"sources":[{"serviceAccountToken":{"path":"token"}},
{"configMap":{"name":"kube-root-ca.crt"}},{"downwardAPI":{"items":[{"path":"namespace"}]}}]}},
{"name":"scratch","emptyDir":{}}],
"containers":[{"name":"train","image":"trainer","volumeMounts":[
{"name":"sedna-host-data-surface-defects","mountPath":"/home/data/data/surface-defects"},
{"name":"kube-api-access-x1","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true},
{"name":"scratch","mountPath":"/tmp"}]}]}}`

// withSpec is renderedTrainer with its spec's field set to value (JSON), or with a container's field set when
// field starts with "container.".
func withSpec(t *testing.T, field, value string) string {
	t.Helper()
	var pod map[string]any
	if err := json.Unmarshal([]byte(renderedTrainer), &pod); err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal([]byte(value), &v); err != nil {
		t.Fatalf("%s: %v", value, err)
	}
	spec := pod["spec"].(map[string]any)
	if c, ok := strings.CutPrefix(field, "container."); ok {
		spec["containers"].([]any)[0].(map[string]any)[c] = v
	} else {
		spec[field] = v
	}
	out, _ := json.Marshal(pod)
	return string(out)
}

func TestRenderedWorkerIsRebuiltWithoutItsServiceAccount(t *testing.T) {
	out, err := staticPodManifest(renderedTrainer, "default/fl-trainer-0", "fl-trainer-0", Bound{})
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Metadata struct{ Annotations, Labels map[string]string }
		Spec     struct {
			HostNetwork                  bool    `json:"hostNetwork"`
			ServiceAccountName           *string `json:"serviceAccountName"`
			AutomountServiceAccountToken *bool   `json:"automountServiceAccountToken"`
			Volumes                      []struct{ Name string }
			Containers                   []struct {
				VolumeMounts []struct{ Name, MountPath string } `json:"volumeMounts"`
			}
		}
	}
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Metadata.Annotations[lifelinev1.StaticPodOfAnnotation] != "default/fl-trainer-0" {
		t.Errorf("annotations %v: not marked as the agent's", pod.Metadata.Annotations)
	}
	if pod.Metadata.Labels[lifelinev1.StandInLabel] != "true" {
		t.Errorf("labels %v: nothing tells the stand-in from its worker", pod.Metadata.Labels)
	}
	if !pod.Spec.HostNetwork || pod.Spec.ServiceAccountName != nil || pod.Spec.AutomountServiceAccountToken == nil ||
		*pod.Spec.AutomountServiceAccountToken {
		t.Errorf("spec %+v: want the host network kept, no service account and no token mounted", pod.Spec)
	}
	var volumes, mounts []string
	for _, v := range pod.Spec.Volumes {
		volumes = append(volumes, v.Name)
	}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts = append(mounts, m.Name+"@"+m.MountPath)
	}
	if fmt.Sprint(volumes) != "[sedna-host-data-surface-defects scratch]" ||
		fmt.Sprint(mounts) != "[sedna-host-data-surface-defects@/home/data/data/surface-defects scratch@/tmp]" {
		t.Errorf("volumes %v, mounts %v: want the Dataset and the scratch space, not the token", volumes, mounts)
	}
}

// Each manifest is one a hostile source could serve for a worker of the node; none may reach edged, which runs
// static pods without admission.
func TestRebuildRefusesManifestsThatReachTheNode(t *testing.T) {
	for _, tc := range []struct{ name, manifest, reason string }{
		{"privileged container", withSpec(t, "container.securityContext", `{"privileged":true}`), "privileged"},
		{"added capability", withSpec(t, "container.securityContext", `{"capabilities":{"add":["SYS_ADMIN"]}}`), "adds capabilities"},
		{"unmasked proc", withSpec(t, "container.securityContext", `{"procMount":"Unmasked"}`), "procMount"},
		{"no seccomp", withSpec(t, "securityContext", `{"seccompProfile":{"type":"Unconfined"}}`), "seccomp"},
		{"host PID", withSpec(t, "hostPID", `true`), "PID or IPC"},
		{"host IPC", withSpec(t, "hostIPC", `true`), "PID or IPC"},
		{"privileged init container", withSpec(t, "initContainers", `[{"name":"i","securityContext":{"privileged":true}}]`), "privileged"},
		{"node root", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/"}}]`), "not a clean directory"},
		{"node directory above the system's", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/var"}}]`), "/var/lib"},
		{"edgecore's certificates", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/etc/kubeedge/certs"}}]`), "/etc"},
		{"unclean path", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/data/../etc"}}]`), "not a clean directory"},
		{"runtime socket", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/data/x.sock","type":"Socket"}}]`), "not as a directory"},
		{"node path by a sub-path", withSpec(t, "container.volumeMounts",
			`[{"name":"sedna-host-data-surface-defects","mountPath":"/home/data/data/surface-defects","subPath":"../.."}]`), "sub-path"},
		{"a Secret", withSpec(t, "volumes", `[{"name":"s","secret":{"secretName":"x"}}]`), "kind secret"},
		{"two sources in a volume", withSpec(t, "volumes", `[{"name":"s","hostPath":{"path":"/data/x"},"nfs":{"server":"n","path":"/"}}]`),
			"more than one source"},
		{"a block device", withSpec(t, "container.volumeDevices", `[{"name":"d","devicePath":"/dev/xvda"}]`), "block device"},
		{"the agent's state", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/srv/lifeline/state"}}]`), "/srv/lifeline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := staticPodManifest(tc.manifest, "default/fl-trainer-0", "fl-trainer-0", Bound{Protected: []string{"/srv/lifeline/state/agent"}})
			var refused *RefusedManifestError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %v, want a refusal saying %q", err, tc.reason)
			}
		})
	}
}

// Sedna's examples mount an output directory of their own choosing (helmet detection: DirectoryOrCreate under
// /var/lib): a node path outside the system's is a worker's to have, offline too.
func TestWorkersOwnNodeDirectoryIsRebuilt(t *testing.T) {
	manifest := withSpec(t, "volumes", `[{"name":"results","hostPath":{"path":"/var/lib/helmet-detection/output","type":"DirectoryOrCreate"}}]`)
	manifest = strings.Replace(manifest, `"volumeMounts":[`, `"volumeMounts":[{"name":"results","mountPath":"/output"},`, 1)
	if _, err := staticPodManifest(manifest, "default/w", "w", Bound{}); err != nil {
		t.Fatal(err)
	}
}
