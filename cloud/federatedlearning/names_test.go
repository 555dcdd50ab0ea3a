package federatedlearning

import (
	"strings"
	"testing"
)

func TestNamesFitAndStayDistinct(t *testing.T) {
	long := strings.Repeat("federated-", 8) // 80 characters
	cases := []struct {
		name, got, want string
	}{
		{"short aggregator", AggregatorName("sdd"), "sdd-aggworker"},
		{"short trainer", TrainerName("sdd", 1), "sdd-trainworker-1"},
		{"short service", ServiceName("sdd"), "sdd-aggregation"},
		{"exactly fitting trainer", TrainerName(strings.Repeat("a", 49), 9), strings.Repeat("a", 49) + "-trainworker-9"},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	for _, n := range []string{AggregatorName(long), TrainerName(long, 12), ServiceName(long), nameLabelValue(long)} {
		if len(n) > 63 {
			t.Errorf("%q is %d characters, over 63", n, len(n))
		}
	}
	if TrainerName(long, 1) == TrainerName(long+"x", 1) {
		t.Errorf("two long job names shortened to the same trainer name %q", TrainerName(long, 1))
	}
	first, second := TrainerName(long, 1), TrainerName(strings.Clone(long), 1)
	if first != second || !strings.HasSuffix(first, "-trainworker-1") {
		t.Errorf("shortening is not deterministic or lost the suffix: %q, %q", first, second)
	}
}
