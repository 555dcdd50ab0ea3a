package lifelinev1

import "strings"

// PodPhase is the phase as a pod's status names it: "Running", "Failed", "Gone", ...
func (p Phase) PodPhase() string {
	name := strings.TrimPrefix(p.String(), "PHASE_")
	return name[:1] + strings.ToLower(name[1:])
}
