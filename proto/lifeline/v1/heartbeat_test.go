package lifelinev1

import (
	"testing"
	"time"
)

func TestSilentAfterFollowsTheBirthsIntervalWithinBounds(t *testing.T) {
	for _, tc := range []struct {
		millis uint32
		want   time.Duration
	}{
		{0, 3 * time.Second},      // an agent that does not say
		{1000, 3 * time.Second},   // the default
		{10000, 30 * time.Second}, // a metered link
		{250, 750 * time.Millisecond},
		{1, 3 * time.Second},      // below the bound: taken as the default
		{600000, 3 * time.Second}, // above it
	} {
		if got := SilentAfter(&NodeBirth{HeartbeatIntervalMillis: tc.millis}); got != tc.want {
			t.Errorf("interval %d ms: silent after %v, want %v", tc.millis, got, tc.want)
		}
	}
}
