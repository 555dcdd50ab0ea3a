package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// restrictStandIn holds a stand-in from an untrusted source to what Pod Security's restricted profile lets a pod
// do, but for the host network (the controller gives it to every FL trainer) and node paths (checkVolume keeps
// them below StandInBound.HostPathRoots): it refuses what the profile refuses where the pod asks for it (a root
// user, privilege escalation, sysctls), and sets what the profile requires where the pod is silent (a non-root
// user, no privilege escalation, no capability). A worker whose image runs as root then does not start as a
// stand-in: that worker needs an authenticated source to be healed offline.
func restrictStandIn(spec map[string]any) error {
	podContext := objectAt(spec, "securityContext")
	if err := refuseRoot("the pod", podContext); err != nil {
		return err
	}
	if podContext["sysctls"] != nil {
		return errors.New("the pod sets sysctls")
	}
	podContext["runAsNonRoot"] = true
	for _, field := range containerFields {
		for _, c := range list(spec[field]) {
			container, _ := c.(map[string]any)
			if container == nil {
				continue
			}
			name, _ := container["name"].(string)
			what := fmt.Sprintf("container %q", name)
			sc := objectAt(container, "securityContext")
			if err := refuseRoot(what, sc); err != nil {
				return err
			}
			if escalates, _ := sc["allowPrivilegeEscalation"].(bool); escalates {
				return fmt.Errorf("%s allows privilege escalation", what)
			}
			sc["allowPrivilegeEscalation"] = false
			objectAt(sc, "capabilities")["drop"] = []any{"ALL"}
		}
	}
	return nil
}

// refuseRoot says why a security context that asks for root is refused, nil if it does not.
func refuseRoot(what string, sc map[string]any) error {
	if nonRoot, ok := sc["runAsNonRoot"].(bool); ok && !nonRoot {
		return fmt.Errorf("%s may run as root (runAsNonRoot: false)", what)
	}
	if uid, ok := sc["runAsUser"]; ok && isZero(uid) {
		return fmt.Errorf("%s runs as root (runAsUser: 0)", what)
	}
	return nil
}

// isZero says whether a decoded JSON number is 0 (an integer, as sigs.k8s.io/json preserves it, or not).
func isZero(v any) bool {
	switch n := v.(type) {
	case int64:
		return n == 0
	case float64:
		return n == 0
	}
	return false
}

// defaultSeccomp gives a pod that names no seccomp profile of its own the runtime's default, as the restricted
// profile requires: a static pod passes no admission, and a node runs a pod that names none unconfined unless its
// kubelet defaults it (--seccomp-default, off unless set).
func defaultSeccomp(spec map[string]any) {
	sc := objectAt(spec, "securityContext")
	if profile, _ := sc["seccompProfile"].(map[string]any); profile == nil {
		sc["seccompProfile"] = map[string]any{"type": "RuntimeDefault"}
	}
}

// Annotations that still choose a profile on nodes that read them (before the securityContext fields).
const (
	appArmorAnnotationPrefix  = "container.apparmor.security.beta.kubernetes.io/"
	seccompPodAnnotation      = "seccomp.security.alpha.kubernetes.io/pod"
	seccompContainerAnnotPref = "container.seccomp.security.alpha.kubernetes.io/"
)

// checkProfileAnnotations refuses a pod whose annotations run a container without AppArmor or seccomp.
func checkProfileAnnotations(annotations map[string]any) error {
	for key, v := range annotations {
		value, _ := v.(string)
		if value != "unconfined" {
			continue
		}
		if strings.HasPrefix(key, appArmorAnnotationPrefix) || key == seccompPodAnnotation || strings.HasPrefix(key, seccompContainerAnnotPref) {
			return fmt.Errorf("the pod's annotation %s runs it unconfined", key)
		}
	}
	return nil
}

// checkUntrustedHostPath refuses a node path an untrusted stand-in may not mount: one outside the roots, or
// reached through a symbolic link, which the node's bind mount would follow anywhere (checked as the stand-in is
// written; what does not exist yet the node makes as directories).
func checkUntrustedHostPath(volume, nodePath string, bound StandInBound) error {
	inRoot := false
	for _, root := range bound.HostPathRoots {
		root = path.Clean(root)
		inRoot = inRoot || root != "/" && (nodePath == root || strings.HasPrefix(nodePath, root+"/"))
	}
	if !inRoot {
		return fmt.Errorf("volume %q mounts node path %s, outside the directories an unauthenticated pod source may name %v",
			volume, nodePath, bound.HostPathRoots)
	}
	at := "/"
	for _, part := range strings.Split(strings.TrimPrefix(nodePath, "/"), "/") {
		at = path.Join(at, part)
		info, err := os.Lstat(filepath.Join(bound.HostRoot, at))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("volume %q: node path %s: %w", volume, at, err)
		case info.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("volume %q mounts node path %s through the symbolic link %s", volume, nodePath, at)
		}
	}
	return nil
}

// objectAt is the object under key in m, made (replacing whatever else is there) when there is none.
func objectAt(m map[string]any, key string) map[string]any {
	object, _ := m[key].(map[string]any)
	if object == nil {
		object = map[string]any{}
		m[key] = object
	}
	return object
}
