package standin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// restrictStandIn holds a stand-in from an untrusted source to what Pod Security's restricted profile lets a pod
// do, but for the host network (the controller gives it to every FL trainer) and node paths (checkVolume keeps
// them below Bound.HostPathRoots): it refuses what the profile refuses where the pod asks for it (a root
// user, privilege escalation, sysctls, an SELinux user, role or type of its own, a host port, a probe of another
// host), and sets what the profile requires where the pod is silent (a non-root user, no privilege escalation, no
// capability). A worker whose image runs as root then does not start as a stand-in: that worker needs an
// authenticated source to be healed offline.
func restrictStandIn(spec map[string]any) error {
	podContext := objectAt(spec, "securityContext")
	if err := refuseRoot("the pod", podContext); err != nil {
		return err
	}
	if err := refuseSELinux("the pod", podContext); err != nil {
		return err
	}
	if podContext["sysctls"] != nil {
		return errors.New("the pod sets sysctls")
	}
	podContext["runAsNonRoot"] = true
	for _, container := range containersOf(spec) {
		name, _ := container["name"].(string)
		what := fmt.Sprintf("container %q", name)
		sc := objectAt(container, "securityContext")
		if err := refuseRoot(what, sc); err != nil {
			return err
		}
		if err := refuseSELinux(what, sc); err != nil {
			return err
		}
		if err := refuseHostReach(what, container); err != nil {
			return err
		}
		if escalates, _ := sc["allowPrivilegeEscalation"].(bool); escalates {
			return fmt.Errorf("%s allows privilege escalation", what)
		}
		sc["allowPrivilegeEscalation"] = false
		objectAt(sc, "capabilities")["drop"] = []any{"ALL"}
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

// restrictedSELinuxTypes are the SELinux types the restricted profile allows; user and role it allows none.
var restrictedSELinuxTypes = map[string]bool{"": true, "container_t": true, "container_init_t": true, "container_kvm_t": true,
	"container_engine_t": true}

// refuseSELinux says why a security context's SELinux options are refused (spc_t runs unconfined), nil if they are not.
func refuseSELinux(what string, sc map[string]any) error {
	options, _ := sc["seLinuxOptions"].(map[string]any)
	user, _ := options["user"].(string)
	role, _ := options["role"].(string)
	kind, _ := options["type"].(string)
	if user != "" || role != "" || !restrictedSELinuxTypes[kind] {
		return fmt.Errorf("%s asks for SELinux user %q, role %q, type %q", what, user, role, kind)
	}
	return nil
}

// refuseHostReach says why a container that binds a port of the node or probes another host is refused.
func refuseHostReach(what string, container map[string]any) error {
	for _, p := range list(container["ports"]) {
		if port, _ := p.(map[string]any); port != nil && port["hostPort"] != nil && !isZero(port["hostPort"]) {
			return fmt.Errorf("%s binds host port %v", what, port["hostPort"])
		}
	}
	var handlers []any
	for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		handlers = append(handlers, container[probe])
	}
	if lifecycle, _ := container["lifecycle"].(map[string]any); lifecycle != nil {
		handlers = append(handlers, lifecycle["postStart"], lifecycle["preStop"])
	}
	for _, h := range handlers {
		handler, _ := h.(map[string]any)
		for _, kind := range []string{"httpGet", "tcpSocket"} {
			if action, _ := handler[kind].(map[string]any); action != nil && action["host"] != nil && action["host"] != "" {
				return fmt.Errorf("%s probes host %v", what, action["host"])
			}
		}
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

// checkUntrustedHostPath refuses a node path an untrusted stand-in may not mount: one outside the roots, or one a
// process other than root could make lead elsewhere before the node mounts it (the bind mount follows symbolic
// links): from its root down, no component may be a symbolic link, and every directory the path goes through must
// be root's and writable by root alone (or sticky, with root's entry below), so no worker can swap a link in
// after the check; what does not exist yet, the node makes as directories. Above the roots is the operator's.
func checkUntrustedHostPath(volume, nodePath string, bound Bound) error {
	root := ""
	for _, r := range bound.HostPathRoots {
		if r = path.Clean(r); r != "/" && (nodePath == r || strings.HasPrefix(nodePath, r+"/")) {
			root = r
		}
	}
	if root == "" {
		return fmt.Errorf("volume %q mounts node path %s, outside the directories an unauthenticated pod source may name %v",
			volume, nodePath, bound.HostPathRoots)
	}
	var above fs.FileInfo // the directory the walk comes from, below the root
	at := root
	for _, part := range append([]string{""}, strings.Split(strings.TrimPrefix(nodePath, root), "/")...) {
		at = path.Join(at, part)
		info, err := os.Lstat(filepath.Join(bound.HostRoot, at))
		switch {
		case errors.Is(err, fs.ErrNotExist) && (above == nil || guards(above, nil)):
			return nil
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("volume %q mounts node path %s, whose directory %s another user than root may add to", volume,
				nodePath, path.Dir(at))
		case err != nil:
			return fmt.Errorf("volume %q: node path %s: %w", volume, at, err)
		case info.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("volume %q mounts node path %s through the symbolic link %s", volume, nodePath, at)
		case above != nil && !guards(above, info):
			return fmt.Errorf("volume %q mounts node path %s, whose directory %s another user than root may change", volume,
				nodePath, path.Dir(at))
		}
		if at != nodePath {
			above = info
		}
	}
	return nil
}

// guards tells whether directory dir keeps its entry entry (nil: one it does not have yet) from anyone but root:
// dir is root's, and writable by root alone, or sticky with entry root's.
func guards(dir, entry fs.FileInfo) bool {
	return ownedByRoot(dir) && (dir.Mode().Perm()&0o022 == 0 || dir.Mode()&fs.ModeSticky != 0 && entry != nil && ownedByRoot(entry))
}

// ownedByRoot tells whether root owns info, or the agent's own user (root on a node; not always in a test).
func ownedByRoot(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && (st.Uid == 0 || int(st.Uid) == os.Geteuid())
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
