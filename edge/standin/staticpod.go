package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	sigsjson "sigs.k8s.io/json"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// SystemPaths are node directories no rebuilt worker may mount, whatever its pod said: a static pod runs
// without admission, so a mount of any of them would be a way to root on the node.
var SystemPaths = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run",
	"/sbin", "/sys", "/usr", "/var/lib/containerd", "/var/lib/docker", "/var/lib/edged", "/var/lib/kubeedge",
	"/var/lib/kubelet", "/var/log", "/var/run"}

// RefusedManifestError is a worker's pod that the agent will not write as a static pod: it asks for more than a
// worker may have on a node without admission.
type RefusedManifestError struct{ Reason string }

func (e *RefusedManifestError) Error() string { return "refused for an offline rebuild: " + e.Reason }

// Bound is what a worker's stand-in may have on the node, beyond what staticPodManifest allows every one.
type Bound struct {
	// Protected are node paths no stand-in may mount besides SystemPaths.
	Protected []string
	// Untrusted says the manifests came from a source any process of the node could answer for (plain HTTP, with
	// --allow-insecure-pod-source): each stand-in is then held to what Pod Security's restricted profile lets a
	// pod do (restrictStandIn), with node paths only below HostPathRoots, none of them through a symlink.
	Untrusted bool
	// HostPathRoots are the node directories below which an untrusted stand-in may mount node paths; none: no
	// node path at all.
	HostPathRoots []string
	// HostRoot is where the node's root is mounted in the agent's container ("" for the agent's own root), to
	// look for symlinks on an untrusted stand-in's node paths.
	HostRoot string
}

// staticPodManifest turns a worker's last known pod into the static pod the agent writes, named podName and marked
// as standing in for worker, or refuses it. The pod's source may have been forged (the MetaServer's port is anyone's to bind
// while edgecore restarts) and edged runs a static pod with no admission at all, so only what a worker may have
// passes: no privileged container, no added capability, no host PID or IPC namespace, no unmasked /proc,
// no unconfined seccomp or AppArmor profile, no volume but node directories and files outside the node's system
// directories and protected (Sedna's Models, Datasets and output directories), emptyDir and downwardAPI. The
// host network stays allowed: the controller puts every FL trainer on it. A pod that names no seccomp profile
// gets the runtime's default. From an untrusted source, restrictStandIn holds the pod to less still.
//
// The manifest is read as the node reads it: keys case-sensitively, so that a key Go's decoder would fold
// ("hostpid", "volume\u017f") is, for the checks as for the node, another key; a repeated key is refused.
//
// What ties the pod to the API server is dropped, as upstream Kubernetes requires of static pods: its service
// account, and the projected token volume admission added, which a cut-off node could never fill.
func staticPodManifest(manifest, worker, podName string, bound Bound) ([]byte, error) {
	var pod map[string]any
	strict, err := sigsjson.UnmarshalStrict([]byte(manifest), &pod, sigsjson.DisallowDuplicateFields)
	if err != nil {
		return nil, fmt.Errorf("decoding the manifest: %w", err)
	}
	if len(strict) > 0 {
		return nil, &RefusedManifestError{Reason: fmt.Sprintf("the manifest repeats a key: %v", strict[0])}
	}
	spec, _ := pod["spec"].(map[string]any)
	if spec == nil {
		return nil, &RefusedManifestError{Reason: "the manifest has no spec"}
	}
	dropServiceAccount(spec)
	if err := checkProfileAnnotations(annotationsOf(pod)); err != nil {
		return nil, &RefusedManifestError{Reason: err.Error()}
	}
	if bound.Untrusted {
		if err := restrictStandIn(spec); err != nil {
			return nil, &RefusedManifestError{Reason: err.Error()}
		}
	}
	defaultSeccomp(spec)
	if err := checkStaticSpec(spec, bound); err != nil {
		return nil, &RefusedManifestError{Reason: err.Error()}
	}
	annotationsOf(pod)[lifelinev1.StaticPodOfAnnotation] = worker
	objectAt(objectAt(pod, "metadata"), "labels")[lifelinev1.StandInLabel] = "true"
	objectAt(pod, "metadata")["name"] = podName
	return json.Marshal(pod)
}

// annotationsOf is the annotations of a decoded pod, made (with its metadata) when it has none.
func annotationsOf(pod map[string]any) map[string]any {
	return objectAt(objectAt(pod, "metadata"), "annotations")
}

// dropServiceAccount removes the service account and every projected volume that carries its token, with
// their mounts.
func dropServiceAccount(spec map[string]any) {
	delete(spec, "serviceAccountName")
	delete(spec, "serviceAccount")
	spec["automountServiceAccountToken"] = false
	tokenVolumes := map[string]bool{}
	var kept []any
	for _, v := range list(spec["volumes"]) {
		vol, _ := v.(map[string]any)
		if projected, _ := vol["projected"].(map[string]any); projected != nil && hasTokenSource(projected) {
			name, _ := vol["name"].(string)
			tokenVolumes[name] = true
			continue
		}
		kept = append(kept, v)
	}
	if len(tokenVolumes) == 0 {
		return
	}
	spec["volumes"] = kept
	for _, container := range containersOf(spec) {
		var mounts []any
		for _, m := range list(container["volumeMounts"]) {
			mount, _ := m.(map[string]any)
			if name, _ := mount["name"].(string); !tokenVolumes[name] {
				mounts = append(mounts, m)
			}
		}
		container["volumeMounts"] = mounts
	}
}

func hasTokenSource(projected map[string]any) bool {
	for _, s := range list(projected["sources"]) {
		if source, _ := s.(map[string]any); source["serviceAccountToken"] != nil {
			return true
		}
	}
	return false
}

var containerFields = []string{"initContainers", "containers", "ephemeralContainers"}

// containersOf is every container of a decoded pod spec, init and ephemeral ones too, to read or change in place.
func containersOf(spec map[string]any) []map[string]any {
	var out []map[string]any
	for _, field := range containerFields {
		for _, c := range list(spec[field]) {
			if container, _ := c.(map[string]any); container != nil {
				out = append(out, container)
			}
		}
	}
	return out
}

// staticSpec is what checkStaticSpec reads of a pod spec.
type staticSpec struct {
	HostPID         bool                         `json:"hostPID"`
	HostIPC         bool                         `json:"hostIPC"`
	SecurityContext *securityContext             `json:"securityContext"`
	Volumes         []map[string]json.RawMessage `json:"volumes"`
	Containers      []staticContainer            `json:"containers"`
	InitContainers  []staticContainer            `json:"initContainers"`
	Ephemeral       []staticContainer            `json:"ephemeralContainers"`
}

type staticContainer struct {
	Name            string           `json:"name"`
	SecurityContext *securityContext `json:"securityContext"`
	VolumeMounts    []struct {
		Name        string `json:"name"`
		MountPath   string `json:"mountPath"`
		SubPath     string `json:"subPath"`
		SubPathExpr string `json:"subPathExpr"`
	} `json:"volumeMounts"`
	VolumeDevices []json.RawMessage `json:"volumeDevices"`
}

type securityContext struct {
	Privileged   *bool   `json:"privileged"`
	ProcMount    *string `json:"procMount"`
	Capabilities *struct {
		Add []string `json:"add"`
	} `json:"capabilities"`
	SeccompProfile *struct {
		Type string `json:"type"`
	} `json:"seccompProfile"`
	AppArmorProfile *struct {
		Type string `json:"type"`
	} `json:"appArmorProfile"`
	WindowsOptions *struct {
		HostProcess *bool `json:"hostProcess"`
	} `json:"windowsOptions"`
}

// hostPathTypes a rebuilt worker's node paths may have: no socket or device.
var hostPathTypes = map[string]bool{"": true, "Directory": true, "DirectoryOrCreate": true, "File": true, "FileOrCreate": true}

// volumeKinds a rebuilt worker may have besides hostPath: none of them reaches the node or the API server.
var volumeKinds = map[string]bool{"emptyDir": true, "downwardAPI": true}

func checkStaticSpec(raw map[string]any, bound Bound) error {
	data, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	var spec staticSpec
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &spec); err != nil {
		return fmt.Errorf("the pod spec does not decode: %w", err)
	}
	if spec.HostPID || spec.HostIPC {
		return errors.New("the pod shares the node's PID or IPC namespace")
	}
	if err := checkSecurity("the pod", spec.SecurityContext); err != nil {
		return err
	}
	hostPaths := map[string]string{} // volume name -> node directory
	for _, vol := range spec.Volumes {
		var name string
		_ = sigsjson.UnmarshalCaseSensitivePreserveInts(vol["name"], &name)
		dir, err := checkVolume(name, vol, bound)
		if err != nil {
			return err
		}
		if dir != "" {
			hostPaths[name] = dir
		}
	}
	for _, group := range [][]staticContainer{spec.InitContainers, spec.Containers, spec.Ephemeral} {
		for _, c := range group {
			what := fmt.Sprintf("container %q", c.Name)
			if err := checkSecurity(what, c.SecurityContext); err != nil {
				return err
			}
			if len(c.VolumeDevices) > 0 {
				return fmt.Errorf("%s maps a block device", what)
			}
			for _, m := range c.VolumeMounts {
				if _, ok := hostPaths[m.Name]; ok && (m.SubPathExpr != "" || slices.Contains(strings.Split(m.SubPath, "/"), "..")) {
					return fmt.Errorf("%s mounts node path %s by a sub-path that may leave it", what, hostPaths[m.Name])
				}
			}
		}
	}
	return nil
}

// checkVolume returns the node directory of a hostPath volume ("" for another kind), or why the volume is refused.
func checkVolume(name string, vol map[string]json.RawMessage, bound Bound) (string, error) {
	if len(vol) > 2 || len(vol) == 2 && vol["name"] == nil {
		return "", fmt.Errorf("volume %q has more than one source", name)
	}
	for kind, source := range vol {
		switch {
		case kind == "name" || volumeKinds[kind]:
		case kind == "hostPath":
			var hp struct {
				Path string  `json:"path"`
				Type *string `json:"type"`
			}
			if err := sigsjson.UnmarshalCaseSensitivePreserveInts(source, &hp); err != nil {
				return "", fmt.Errorf("volume %q: %w", name, err)
			}
			if hp.Type != nil && !hostPathTypes[*hp.Type] {
				return "", fmt.Errorf("volume %q mounts node path %s as %s, not as a directory or a file", name, hp.Path, *hp.Type)
			}
			if !path.IsAbs(hp.Path) || path.Clean(hp.Path) != hp.Path || hp.Path == "/" {
				return "", fmt.Errorf("volume %q mounts node path %q, not a clean directory below /", name, hp.Path)
			}
			for _, p := range append(SystemPaths, bound.Protected...) {
				if p != "" && (hp.Path == p || strings.HasPrefix(hp.Path, strings.TrimSuffix(p, "/")+"/") || strings.HasPrefix(p, hp.Path+"/")) {
					return "", fmt.Errorf("volume %q mounts node path %s, which holds or lies in %s", name, hp.Path, p)
				}
			}
			if bound.Untrusted {
				if err := checkUntrustedHostPath(name, hp.Path, bound); err != nil {
					return "", err
				}
			}
			return hp.Path, nil
		default:
			return "", fmt.Errorf("volume %q is of kind %s, which a static pod cannot have", name, kind)
		}
	}
	return "", nil
}

func checkSecurity(what string, sc *securityContext) error {
	switch {
	case sc == nil:
		return nil
	case sc.Privileged != nil && *sc.Privileged:
		return fmt.Errorf("%s is privileged", what)
	case sc.Capabilities != nil && len(sc.Capabilities.Add) > 0:
		return fmt.Errorf("%s adds capabilities %v", what, sc.Capabilities.Add)
	case sc.ProcMount != nil && *sc.ProcMount != "" && *sc.ProcMount != "Default":
		return fmt.Errorf("%s asks for procMount %s", what, *sc.ProcMount)
	case sc.SeccompProfile != nil && sc.SeccompProfile.Type == "Unconfined":
		return fmt.Errorf("%s runs without seccomp", what)
	case sc.AppArmorProfile != nil && sc.AppArmorProfile.Type == "Unconfined":
		return fmt.Errorf("%s runs without AppArmor", what)
	case sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess:
		return fmt.Errorf("%s is a host process", what)
	}
	return nil
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}
