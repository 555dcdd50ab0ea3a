package standin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// refusal is the reason staticPodManifest refuses manifest for, or "" when it takes it.
func refusal(t *testing.T, manifest string, bound Bound) string {
	t.Helper()
	_, err := staticPodManifest(manifest, "default/fl-trainer-0", "fl-trainer-0", bound)
	var refused *RefusedManifestError
	switch {
	case err == nil:
		return ""
	case !errors.As(err, &refused):
		t.Fatalf("error %v, want a refusal", err)
	}
	return refused.Reason
}

// Item 2 of the third hardening round: Go's decoder matches keys case-insensitively (and folds the long s into
// an s), the node matches them exactly. Each manifest has a twin key that Go would have read in place of what the
// node runs: a privileged, hostPID pod with the node's root mounted. None may pass.
func TestCaseFoldedTwinKeysHideNothingFromTheChecks(t *testing.T) {
	head := `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"default","name":"fl-trainer-0"},"spec":{`
	for _, tc := range []struct{ name, spec, reason string }{
		{"the long s beside volumes", `"volumes":[{"name":"r","hostPath":{"path":"/"}}],"volume\u017f":[],"containers":[{"name":"c","image":"i"}]`,
			"not a clean directory"},
		{"the long s beside securityContext", `"containers":[{"name":"c","image":"i","securityContext":{"privileged":true},"\u017fecurityContext":null}]`,
			"privileged"},
		{"lower case beside hostPID", `"hostPID":true,"hostpid":false,"containers":[{"name":"c","image":"i"}]`, "PID or IPC"},
		{"a repeated key", `"hostPID":true,"hostPID":false,"containers":[{"name":"c","image":"i"}]`, "repeats a key"},
		{"a repeated key in a container", `"containers":[{"name":"c","image":"i","securityContext":{"privileged":true,"privileged":false}}]`,
			"repeats a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(t, head+tc.spec+`}}`, Bound{}); !strings.Contains(got, tc.reason) {
				t.Errorf("refused for %q, want %q", got, tc.reason)
			}
		})
	}
}

// untrustedBound is how the agent holds stand-ins read over plain HTTP, on a node whose root is root: Sedna's
// data under /data, which holds the trainer's Dataset directory and a symbolic link to the node's root.
func untrustedBound(t *testing.T) Bound {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "data", "surface-defects"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(root, "data", "escape")); err != nil {
		t.Fatal(err)
	}
	// A directory any worker may write to: it could swap a link in below it after the check.
	shared := filepath.Join(root, "data", "shared")
	if err := os.Mkdir(shared, 0o755); err != nil || os.Chmod(shared, 0o777) != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(shared, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Bound{Untrusted: true, HostPathRoots: []string{"/data"}, HostRoot: root}
}

// Item 2 of the third hardening round, without a trick: what a plain-HTTP source may have written was root on
// the node. Each manifest asks for one such thing; none may pass.
func TestUntrustedSourceGetsNoRootOnTheNode(t *testing.T) {
	bound := untrustedBound(t)
	for _, tc := range []struct{ name, manifest, reason string }{
		{"root user", withSpec(t, "securityContext", `{"runAsUser":0}`), "runAsUser: 0"},
		{"root container", withSpec(t, "container.securityContext", `{"runAsUser":0}`), "runAsUser: 0"},
		{"root allowed", withSpec(t, "container.securityContext", `{"runAsNonRoot":false}`), "runAsNonRoot: false"},
		{"privilege escalation", withSpec(t, "container.securityContext", `{"allowPrivilegeEscalation":true}`), "privilege escalation"},
		{"sysctls", withSpec(t, "securityContext", `{"sysctls":[{"name":"kernel.shm_rmid_forced","value":"1"}]}`), "sysctls"},
		{"CNI plugins", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/opt/cni/bin"}}]`), "outside the directories"},
		{"crontabs", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/var/spool/cron/crontabs"}}]`), "outside the directories"},
		{"ssh keys", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/home/admin/.ssh"}}]`), "outside the directories"},
		{"a symbolic link to the node's root", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/data/escape/etc"}}]`),
			"symbolic link /data/escape"},
		{"below a directory anyone may change", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/data/shared/out"}}]`),
			"another user than root may change"},
		{"to be made in a directory anyone may add to", withSpec(t, "volumes", `[{"name":"r","hostPath":{"path":"/data/shared/new"}}]`),
			"another user than root may add to"},
		{"SELinux unconfined", withSpec(t, "container.securityContext", `{"seLinuxOptions":{"type":"spc_t"}}`), "SELinux"},
		{"SELinux user", withSpec(t, "securityContext", `{"seLinuxOptions":{"user":"system_u","role":"system_r"}}`), "SELinux"},
		{"host port", withSpec(t, "container.ports", `[{"containerPort":80,"hostPort":80}]`), "host port"},
		{"probe of another host", withSpec(t, "container.livenessProbe", `{"httpGet":{"host":"10.0.0.1","port":80}}`), "probes host"},
		{"unconfined AppArmor", strings.Replace(renderedTrainer, `"name":"fl-trainer-0"`,
			`"name":"fl-trainer-0","annotations":{"container.apparmor.security.beta.kubernetes.io/train":"unconfined"}`, 1), "apparmor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(t, tc.manifest, bound); !strings.Contains(got, tc.reason) {
				t.Errorf("refused for %q, want %q", got, tc.reason)
			}
		})
	}
}

// restrictedPod is what the tests read of a stand-in's security.
type restrictedPod struct {
	Spec struct {
		SecurityContext struct {
			RunAsNonRoot   *bool `json:"runAsNonRoot"`
			SeccompProfile struct {
				Type string `json:"type"`
			} `json:"seccompProfile"`
		} `json:"securityContext"`
		Containers []struct {
			SecurityContext struct {
				AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
				Capabilities             struct {
					Drop []string `json:"drop"`
				} `json:"capabilities"`
			} `json:"securityContext"`
		} `json:"containers"`
	} `json:"spec"`
}

func restrictedStandIn(t *testing.T, manifest string, bound Bound) restrictedPod {
	t.Helper()
	out, err := staticPodManifest(manifest, "default/fl-trainer-0", "fl-trainer-0", bound)
	if err != nil {
		t.Fatal(err)
	}
	var pod restrictedPod
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// A trainer as the controller renders it passes from a plain-HTTP source as a restricted pod: not root, no
// privilege escalation, no capability, the runtime's seccomp profile, its Dataset's directory below /data.
func TestUntrustedStandInRunsAsARestrictedPod(t *testing.T) {
	pod := restrictedStandIn(t, renderedTrainer, untrustedBound(t))
	sc, c := pod.Spec.SecurityContext, pod.Spec.Containers[0].SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile.Type != "RuntimeDefault" ||
		c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation || strings.Join(c.Capabilities.Drop, ",") != "ALL" {
		t.Errorf("stand-in %+v, want a restricted pod", pod.Spec)
	}
}

// Item 7 of the third hardening round: a stand-in whose worker names no seccomp profile runs with the runtime's
// default, not unconfined; one that names its own keeps it.
func TestStandInGetsTheRuntimesSeccompProfileUnlessItNamesOne(t *testing.T) {
	if got := restrictedStandIn(t, renderedTrainer, Bound{}).Spec.SecurityContext.SeccompProfile.Type; got != "RuntimeDefault" {
		t.Errorf("seccomp %q, want RuntimeDefault", got)
	}
	own := withSpec(t, "securityContext", `{"seccompProfile":{"type":"Localhost","localhostProfile":"trainer.json"}}`)
	if got := restrictedStandIn(t, own, Bound{}).Spec.SecurityContext.SeccompProfile.Type; got != "Localhost" {
		t.Errorf("seccomp %q, want the worker's Localhost", got)
	}
}
