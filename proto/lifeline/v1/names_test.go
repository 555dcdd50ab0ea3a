package lifelinev1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks agree with Kubernetes' own on names that pass and names that fail.
func TestDNSChecksAgreeWithKubernetes(t *testing.T) {
	names := []string{"a", "edge-1", "edge1.site-a", "-a", "a-", "A", "a_b", "a..b", ".a", "a.", "", "1", "a.b.c",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a",
		"a/b", "+", "#", "edge-1\n"}
	for _, n := range names {
		if got, want := CheckDNSLabel(n) == nil, len(validation.IsDNS1123Label(n)) == 0; got != want {
			t.Errorf("CheckDNSLabel(%q) ok=%v, Kubernetes says %v", n, got, want)
		}
		if got, want := CheckDNSSubdomain(n) == nil, len(validation.IsDNS1123Subdomain(n)) == 0; got != want {
			t.Errorf("CheckDNSSubdomain(%q) ok=%v, Kubernetes says %v", n, got, want)
		}
	}
}
