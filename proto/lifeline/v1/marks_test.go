package lifelinev1

import (
	"testing"
	"time"
)

func TestStaticPodOfRoundTrips_P_HEAL_3(t *testing.T) {
	cases := []struct {
		value         string
		namespace, pd string
		ok            bool
	}{
		{StaticPodOf("default", "trainer-0"), "default", "trainer-0", true},
		{StaticPodOf("team-a", "sdd.trainer-0"), "team-a", "sdd.trainer-0", true},
		{"default", "", "", false},
		{"/trainer-0", "", "", false},
		{"default/", "", "", false},
		{"Default/trainer-0", "", "", false},
		{"default/trainer/0", "", "", false},
		{"de.fault/trainer-0", "", "", false},
	}
	for _, tc := range cases {
		ns, pod, ok := ParseStaticPodOf(tc.value)
		if ns != tc.namespace || pod != tc.pd || ok != tc.ok {
			t.Errorf("ParseStaticPodOf(%q) = %q, %q, %v; want %q, %q, %v", tc.value, ns, pod, ok, tc.namespace, tc.pd, tc.ok)
		}
	}
}

func TestIDs_P_CMD_5(t *testing.T) {
	cases := []struct{ got, want string }{
		{CommandID(Action_ACTION_REBUILD, "u1", 7), "rebuild/u1/7"},
		{CommandID(Action_ACTION_RESTART, "u1", 7), "restart/u1/7"},
		{LocalResultID("u1", time.Unix(5, 6)), "local/u1/5000000006"},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("id %q, want %q", tc.got, tc.want)
		}
	}
}
