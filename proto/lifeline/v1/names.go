package lifelinev1

import (
	"fmt"
	"regexp"
	"strings"
)

// The DNS-1123 rules Kubernetes applies to names, checked here without Kubernetes' libraries: the edge agent
// links this package and stays small.
var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// CheckDNSLabel returns why s is not a DNS-1123 label (namespaces, cluster names), or nil.
func CheckDNSLabel(s string) error {
	if len(s) > 63 || !dnsLabel.MatchString(s) {
		return fmt.Errorf("%q is not a DNS-1123 label: at most 63 lower-case alphanumerics or '-', starting and ending alphanumeric", s)
	}
	return nil
}

// CheckDNSSubdomain returns why s is not a DNS-1123 subdomain (node and pod names), or nil.
func CheckDNSSubdomain(s string) error {
	if len(s) > 253 {
		return fmt.Errorf("%q is not a DNS-1123 subdomain: longer than 253 characters", s)
	}
	for _, label := range strings.Split(s, ".") {
		if !dnsLabel.MatchString(label) {
			return fmt.Errorf("%q is not a DNS-1123 subdomain: dot-separated lower-case alphanumerics or '-', each part starting and ending alphanumeric", s)
		}
	}
	return nil
}
