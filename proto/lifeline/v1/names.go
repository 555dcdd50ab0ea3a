package lifelinev1

import (
	"fmt"
	"strings"
)

// The DNS-1123 rules Kubernetes applies to names, checked here without Kubernetes' libraries (the edge agent
// links this package and stays small) and without regular expressions (every message's topic is checked).

// CheckDNSLabel returns why s is not a DNS-1123 label (namespaces, cluster names), or nil.
func CheckDNSLabel(s string) error {
	if len(s) > 63 || !labelShaped(s) {
		return fmt.Errorf("%q is not a DNS-1123 label: at most 63 lower-case alphanumerics or '-', starting and ending alphanumeric", s)
	}
	return nil
}

// CheckDNSSubdomain returns why s is not a DNS-1123 subdomain (node and pod names), or nil.
func CheckDNSSubdomain(s string) error {
	if len(s) > 253 {
		return fmt.Errorf("%q is not a DNS-1123 subdomain: longer than 253 characters", s)
	}
	for label := range strings.SplitSeq(s, ".") {
		if !labelShaped(label) {
			return fmt.Errorf("%q is not a DNS-1123 subdomain: dot-separated lower-case alphanumerics or '-', each part starting and ending alphanumeric", s)
		}
	}
	return nil
}

// labelShaped says whether s is lower-case alphanumerics or '-', at least one, starting and ending alphanumeric.
func labelShaped(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
